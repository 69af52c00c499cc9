"""Wire models: camelCase JSON, strict types, one model per event `type`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
)
from pydantic.alias_generators import to_camel

from rig_conductor import domain


def _storable(value: str) -> str:
    """Text PostgreSQL can store: no NUL character, no lone surrogate."""
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (lone surrogate)") from None
    return value


# Strict types: a number where a string belongs is a 422, not silently converted.
# A name (agent id, consumer, stream): `domain.name`, 1..200 characters, no control characters.
Name = Annotated[
    StrictStr,
    Field(min_length=1, max_length=domain.NAME_MAX_LENGTH),
    AfterValidator(_storable),
    AfterValidator(domain.name),
]
# Other short text a client names (an issue id, an idempotency key, a degraded reason).
Text = Annotated[StrictStr, Field(min_length=1, max_length=256), AfterValidator(_storable)]
# A name in a query string or a path: the same rule, a 422 naming the parameter.
NameParam = Annotated[str, AfterValidator(domain.name)]
# A stream entry id, in a body or a query: `domain.entry_id` (both parts <= 2^64-1), with the
# pattern published in the OpenAPI document.
ENTRY_ID_PATTERN = domain.ENTRY_ID_PATTERN
EntryIdField = Annotated[
    StrictStr,
    Field(pattern=ENTRY_ID_PATTERN, max_length=domain.ENTRY_ID_MAX_LENGTH),
    AfterValidator(domain.entry_id),
]


class Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class HeartbeatEvent(Wire):
    type: Literal["HEARTBEAT"]
    agent_id: Name
    consumer: Name | None = None
    degraded: StrictBool = False
    degraded_reasons: Annotated[list[Text], Field(max_length=64)] = []


class IssueAssignedEvent(Wire):
    type: Literal["ISSUE_ASSIGNED"]
    issue_id: Text
    agent_id: Name
    payload: dict[str, Any] = {}
    idempotency_key: Text | None = None


Attempt = Annotated[StrictInt, Field(ge=1)]


class _WorkFields(Wire):
    agent_id: Name
    stream: Name
    entry_id: EntryIdField
    # The consumer the report comes from: only the entry's owner may report on it.
    consumer: Name
    issue_id: Text | None = None
    error: Annotated[StrictStr, Field(max_length=4096), AfterValidator(_storable)] | None = None


class WorkStartedEvent(_WorkFields):
    """From a consumer holding the entry in a pending list; `attempt`, when given, is the
    attempt it believes current (an older one is fenced)."""

    type: Literal["WORK_STARTED"]
    attempt: Attempt | None = None


class WorkReportEvent(_WorkFields):
    """From the consumer that owns `attempt`: its start, or the reclaim to it, made it."""

    type: Literal["WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED"]
    attempt: Attempt


WorkEvent = WorkStartedEvent | WorkReportEvent

Event = Annotated[
    HeartbeatEvent | IssueAssignedEvent | WorkStartedEvent | WorkReportEvent,
    Field(discriminator="type"),
]


class Accepted(Wire):
    accepted: bool = True


class DispatchResult(Wire):
    stream: str
    entry_id: str


class WorkStarted(Wire):
    attempt: int


class WorkResult(Wire):
    accepted: bool
    attempt: int
    state: str


class Fenced(Wire):
    detail: str
    attempt: int
    state: str


class AgentView(Wire):
    agent_id: str
    last_heartbeat_at: datetime | None
    heartbeat_age_ms: int | None
    down: bool
    degraded: bool
    degraded_reasons: list[str]
    # GET /api/agents: the 10 freshest; GET /api/agents/{agentId}: a page of them by name.
    consumers: list[str]
    consumer_count: int


class ConsumerView(Wire):
    name: str
    pending: int
    idle_ms: int
    agent_id: str | None


class GroupView(Wire):
    """A group as the last scan measured it (`asOf`): `consumers` lists at most 10, those
    holding the most entries first; `consumerCount` counts them all."""

    stream: str
    group: str
    pending: int
    oldest_pending_idle_ms: int | None
    consumers: list[ConsumerView]
    consumer_count: int
    consumers_down: int
    dead_letters: int
    as_of: datetime


class GroupConsumerView(ConsumerView):
    """A consumer of one group, read live from Redis and judged by the reaper's rules."""

    down: bool
    down_reasons: list[str]
    degraded: bool
    heartbeat_age_ms: int | None


class DeadLetterView(Wire):
    stream: str
    dlq_id: str
    original_id: str
    group: str
    consumer: str
    # None when the letter's `deliveries` is not a count (a letter the reaper did not write).
    deliveries: int | None
    reason: str
    fields: dict[str, str]


class RequeueRequest(Wire):
    stream: Name
    dlq_id: EntryIdField


class Requeued(Wire):
    stream: str
    entry_id: str
    dlq_id: str


class FieldProblem(Wire):
    field: str
    message: str
    type: str


class ValidationProblem(Wire):
    """The 422 answer: `detail` is "<field>: <message>" for the first problem."""

    detail: str
    errors: list[FieldProblem]


class Problem(Wire):
    detail: str


ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": Problem, "description": "missing or invalid bearer token"},
    413: {"model": Problem, "description": "body over 64 KiB"},
    422: {"model": ValidationProblem, "description": "the request names a bad field"},
    503: {"model": Problem, "description": "Redis or PostgreSQL unavailable; see Retry-After"},
}
