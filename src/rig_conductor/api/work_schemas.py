"""Wire models of the routes that find the work: one piece of work's story, a group's pending
entries, moves by hand, the reclaims and dead letters many at a time."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from rig_conductor import domain
from rig_conductor.api.schemas import EntryIdField, Name, Text, Wire


def optional_entry_id(value: str | None) -> str | None:
    """`domain.entry_id` for an optional query parameter: None stays None."""
    return None if value is None else domain.entry_id(value)


WorkState = Literal["unread", "pending", "running", "done", "failed", "dead-lettered"]
ItemKind = Literal[
    "DISPATCHED",
    "STARTED",
    "PROGRESS",
    "COMPLETED",
    "PUBLISHED",
    "FAILED",
    "FENCED",
    "RECLAIMED",
    "DEAD_LETTERED",
    "REQUEUED",
    "DELETED",
]


class GroupWork(Wire):
    group: str
    state: WorkState
    holder: str | None
    attempt: int | None


class TimelineItem(Wire):
    """What happened, when; only the fields that apply are present. A run of progress reports
    of one attempt is one PROGRESS item with `count` (and `until`, the last one's time)."""

    at: datetime
    kind: ItemKind
    entry_id: str | None = None
    group: str | None = None
    consumer: str | None = None
    agent_id: str | None = None
    attempt: int | None = None
    from_: str | None = Field(default=None, alias="from")
    to: str | None = None
    reason: str | None = None
    count: int | None = None
    until: datetime | None = None
    by: str | None = None
    asked_by: str | None = None
    dlq_id: str | None = None
    replaces: str | None = None


class WorkStory(Wire):
    """`stream`, `entryId`, `state` and `groups` describe the current entry (an issue's newest);
    `timeline` follows all of them, a page at a time: `next` is the `after` of the next page
    (null on the last)."""

    issue_id: str | None
    stream: str
    entry_id: str
    state: WorkState
    groups: list[GroupWork]
    timeline: list[TimelineItem]
    entries: list[str]
    next: str | None = None


class PendingView(Wire):
    entry_id: str
    consumer: str
    idle_ms: int
    deliveries: int
    issue_id: str | None


class MoveRequest(Wire):
    stream: Name
    group: Name
    entry_ids: list[EntryIdField] = Field(min_length=1, max_length=1000)
    to: Name


class Skipped(Wire):
    entry_id: str
    why: str


class MoveResult(Wire):
    moved: list[str]
    skipped: list[Skipped]


class ReclaimView(Wire):
    at: datetime
    stream: str
    group: str
    from_: str = Field(alias="from")
    from_agent: str | None
    to: str
    to_agent: str | None
    reason: str
    by: str | None
    entry_ids: list[str]
    # The page cursor: `after` of the next page is the last item's `id`.
    id: str


class DeadLetterMatch(Wire):
    reason: Text | None = None
    text: Text | None = None


class DeadLettersRequest(Wire):
    """One dead letter (`dlqId`), several (`dlqIds`) or every one that matches (`match`)."""

    stream: Name
    dlq_id: EntryIdField | None = None
    dlq_ids: list[EntryIdField] | None = Field(default=None, min_length=1, max_length=10_000)
    match: DeadLetterMatch | None = None


class DeadLettersDone(Wire):
    stream: str
    requeued: int | None = None
    deleted: int | None = None
