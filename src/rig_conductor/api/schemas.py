"""Wire models: camelCase JSON, strict types, one model per event `type` (`domain.EventKind`)."""

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
    model_validator,
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
    type: Literal[domain.EventKind.HEARTBEAT]
    agent_id: Name
    consumer: Name | None = None
    degraded: StrictBool = False
    degraded_reasons: Annotated[list[Text], Field(max_length=64)] = []


class IssueAssignedEvent(Wire):
    type: Literal[domain.EventKind.ISSUE_ASSIGNED]
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
    # The group the entry was read in.
    group: Name | None = None
    issue_id: Text | None = None
    error: Annotated[StrictStr, Field(max_length=4096), AfterValidator(_storable)] | None = None


class WorkStartedEvent(_WorkFields):
    """From a consumer holding the entry in a pending list; `attempt`, when given, is the
    attempt it believes current (an older one is fenced)."""

    type: Literal[domain.EventKind.WORK_STARTED]
    attempt: Attempt | None = None


class WorkReportEvent(_WorkFields):
    """From the consumer that owns `attempt`: its start, or the reclaim to it, made it."""

    type: Literal[domain.EventKind.WORK_PROGRESS, domain.EventKind.WORK_FAILED]
    attempt: Attempt


Path = Annotated[StrictStr, Field(min_length=1, max_length=4096), AfterValidator(_storable)]


class StagedOutputModel(Wire):
    """A file the attempt staged (`staged`), to be renamed onto `path` once accepted."""

    staged: Path
    path: Path


class WorkCompletedEvent(_WorkFields):
    """From the consumer that owns `attempt`. `outputs`: the files it staged, recorded with the
    completion and published (renamed onto their paths) exactly once after it is accepted."""

    type: Literal[domain.EventKind.WORK_COMPLETED]
    attempt: Attempt
    outputs: Annotated[list[StagedOutputModel], Field(max_length=256)] = []

    @model_validator(mode="after")
    def _staged_for_this_attempt(self) -> WorkCompletedEvent:
        for item in self.outputs:
            expected = domain.staged_path(item.path, entry_id=self.entry_id, attempt=self.attempt)
            try:
                domain.staged_output(item.staged, item.path, attempt=self.attempt)
            except ValueError as exc:
                raise ValueError(f"outputs: {exc}") from None
            if item.staged != expected:
                raise ValueError(f"outputs: staged file {item.staged!r} is not {expected!r}")
        return self


class WorkPublishedEvent(_WorkFields):
    """The accepted attempt's outputs renamed onto their paths: from that attempt's owner, or from
    a consumer that holds the entry now. `missing` names paths whose staged file was found
    nowhere: the completion cannot be published, and the entry runs again."""

    type: Literal[domain.EventKind.WORK_PUBLISHED]
    attempt: Attempt
    missing: Annotated[list[Path], Field(max_length=256)] = []


class DeadLetterEvent(_WorkFields):
    """An agent asks the conductor to dead-letter an entry it holds in `group`: worn out by
    deliveries (`max-deliveries`) or gone from the stream (`trimmed`). Agents never write the
    dead-letter stream themselves."""

    type: Literal[domain.EventKind.DEAD_LETTER]
    group: Name
    reason: Literal["max-deliveries", "trimmed"]


WorkEvent = WorkStartedEvent | WorkReportEvent | WorkCompletedEvent | WorkPublishedEvent

Event = Annotated[
    HeartbeatEvent
    | IssueAssignedEvent
    | WorkStartedEvent
    | WorkReportEvent
    | WorkCompletedEvent
    | WorkPublishedEvent
    | DeadLetterEvent,
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


class DeadLetterResult(Wire):
    """DEAD_LETTER done: the entry copied to `dlqStream` as `dlqId` and acked."""

    stream: str
    entry_id: str
    dlq_stream: str
    dlq_id: str
    deliveries: int


class Fenced(Wire):
    detail: str
    attempt: int
    state: str
    # A done entry whose accepted outputs are not published yet: the holder that asked renames
    # them onto their paths, reports WORK_PUBLISHED, then acks.
    outputs: list[StagedOutputModel] | None = None


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
