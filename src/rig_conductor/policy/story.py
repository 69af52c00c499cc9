"""The story of one piece of work, told from facts: event-log rows become timeline items, and
what Redis and the assignment row say of an entry becomes a state per group.

Pure: the rows and the Redis look come in as data; nothing here reads a clock or a server.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from rig_conductor.domain import AssignmentState, EventKind


class Kind(enum.StrEnum):
    """What happened to the work, as an operator reads it (the timeline's `kind`)."""

    DISPATCHED = "DISPATCHED"
    STARTED = "STARTED"
    PROGRESS = "PROGRESS"
    COMPLETED = "COMPLETED"
    PUBLISHED = "PUBLISHED"
    FAILED = "FAILED"
    FENCED = "FENCED"
    RECLAIMED = "RECLAIMED"
    DEAD_LETTERED = "DEAD_LETTERED"
    REQUEUED = "REQUEUED"
    DELETED = "DELETED"


class State(enum.StrEnum):
    """Where the work stands in one group (and, summed up, as a whole)."""

    UNREAD = "unread"
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DEAD_LETTERED = "dead-lettered"


# The event-log kinds that tell a story, and what each is called on the timeline.
EVENT_KINDS: Mapping[str, Kind] = {
    EventKind.ISSUE_ASSIGNED: Kind.DISPATCHED,
    EventKind.WORK_STARTED: Kind.STARTED,
    EventKind.WORK_PROGRESS: Kind.PROGRESS,
    EventKind.WORK_COMPLETED: Kind.COMPLETED,
    EventKind.WORK_PUBLISHED: Kind.PUBLISHED,
    EventKind.WORK_FAILED: Kind.FAILED,
    EventKind.RECLAIMED: Kind.RECLAIMED,
    EventKind.DEAD_LETTERED: Kind.DEAD_LETTERED,
    EventKind.DEAD_LETTER_REQUEUED: Kind.REQUEUED,
    EventKind.DEAD_LETTER_DELETED: Kind.DELETED,
}
# The least finished state a group is in sums the work up: work is done when every group is.
_SUMMARY_ORDER = (
    State.RUNNING,
    State.FAILED,
    State.PENDING,
    State.UNREAD,
    State.DEAD_LETTERED,
    State.DONE,
)
# The assignment row's states, when Redis no longer has the entry to ask.
_ASSIGNMENT_STATES: Mapping[str, State] = {
    AssignmentState.PENDING: State.PENDING,
    AssignmentState.RUNNING: State.RUNNING,
    AssignmentState.DONE: State.DONE,
    AssignmentState.FAILED: State.FAILED,
    AssignmentState.DEAD: State.DEAD_LETTERED,
    AssignmentState.SUPERSEDED: State.PENDING,  # its dispatch goes on as another entry
}


class Row(Protocol):
    """An event-log row, or a run of WORK_PROGRESS rows folded into one (`count`)."""

    @property
    def occurred_at(self) -> datetime: ...
    @property
    def until(self) -> datetime: ...
    @property
    def kind(self) -> str: ...
    @property
    def consumer(self) -> str | None: ...
    @property
    def agent_id(self) -> str | None: ...
    @property
    def stream(self) -> str | None: ...
    @property
    def group_name(self) -> str | None: ...
    @property
    def entry_id(self) -> str | None: ...
    @property
    def attempt(self) -> int | None: ...
    @property
    def fenced(self) -> bool: ...
    @property
    def detail(self) -> Mapping[str, Any]: ...
    @property
    def count(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Assignment:
    """The assignment row of an entry: who works on it, which attempt is current."""

    state: str
    consumer: str | None
    attempt: int


@dataclass(frozen=True, slots=True)
class GroupLook:
    """One group of the entry's stream as Redis shows it now."""

    group: str
    delivered: bool  # the group's last-delivered id is at or past the entry
    holder: str | None  # the consumer whose pending list has the entry


@dataclass(frozen=True, slots=True)
class GroupStory:
    group: str
    state: State
    holder: str | None
    attempt: int | None


def item(row: Row) -> dict[str, Any]:
    """One timeline item: `at`, `kind` and what applies of the rest (None left out)."""
    kind = EVENT_KINDS[row.kind]
    detail = row.detail
    out: dict[str, Any] = {
        "at": row.occurred_at,
        "kind": kind,
        "entryId": row.entry_id,
        "group": row.group_name,
        "consumer": row.consumer,
        "agentId": row.agent_id,
        "attempt": row.attempt,
    }
    if row.fenced and kind in (Kind.STARTED, Kind.PROGRESS, Kind.COMPLETED, Kind.FAILED):
        out["kind"] = Kind.FENCED
        out["reason"] = f"{row.kind} of an attempt that is no longer current"
    if kind is Kind.PROGRESS and row.count > 1:
        out["count"] = row.count
        out["until"] = row.until
    if kind is Kind.RECLAIMED:
        out["from"] = row.consumer
        out["to"] = detail.get("toConsumer")
        out["reason"] = detail.get("reason") or "down"  # rows from before reasons were kept
        out["by"] = detail.get("by")
        out["consumer"] = None
    elif kind is Kind.DEAD_LETTERED:
        out["reason"] = detail.get("reason")
        out["askedBy"] = detail.get("askedBy")
        out["dlqId"] = detail.get("dlqId")
    elif kind in (Kind.REQUEUED, Kind.DELETED):
        out["dlqId"] = detail.get("dlqId")
        out["by"] = detail.get("by")
    elif kind is Kind.DISPATCHED:
        out["replaces"] = detail.get("replaces")
    elif kind is Kind.FAILED and not row.fenced:
        out["reason"] = detail.get("error")
    return {key: value for key, value in out.items() if value is not None}


def group_state(
    look: GroupLook, assignment: Assignment | None, *, dead_lettered: bool
) -> GroupStory:
    """Where the entry stands in one group. Held: running or failed when the holder owns the
    current attempt, done when that attempt's completion was accepted (the ack is on its way),
    else pending. Not held: dead-lettered there, unread, or done (read and acknowledged)."""
    owns = assignment is not None and look.holder is not None and assignment.consumer == look.holder
    attempt = assignment.attempt if owns and assignment is not None else None
    if look.holder is not None:
        state = State.PENDING
        if owns and assignment is not None:
            state = _ASSIGNMENT_STATES.get(assignment.state, State.PENDING)
            if state is State.DEAD_LETTERED:
                state = State.PENDING
        return GroupStory(look.group, state, look.holder, attempt)
    if dead_lettered:
        return GroupStory(look.group, State.DEAD_LETTERED, None, _finished_attempt(assignment))
    if not look.delivered:
        return GroupStory(look.group, State.UNREAD, None, None)
    return GroupStory(look.group, State.DONE, None, _finished_attempt(assignment))


def _finished_attempt(assignment: Assignment | None) -> int | None:
    if assignment is None or assignment.state not in (AssignmentState.DONE, AssignmentState.DEAD):
        return None
    return assignment.attempt


def summary(groups: Sequence[GroupStory], assignment: Assignment | None) -> State:
    """The work's state: its least finished group; with no group to ask (Redis lost the entry,
    or nobody reads the stream), what the assignment row says (unread: no row)."""
    if groups:
        states = {g.state for g in groups}
        return next(state for state in _SUMMARY_ORDER if state in states)
    if assignment is None:
        return State.UNREAD
    return _ASSIGNMENT_STATES.get(assignment.state, State.PENDING)


def entry_key(entry_id: str) -> tuple[int, int]:
    """A stream id as numbers, for comparing it with a group's last-delivered id."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
