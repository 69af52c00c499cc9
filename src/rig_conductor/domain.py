"""The nouns of the conductor: typed identifiers and the immutable facts a scan works on.

Plain data only. No I/O, no clock: adapters build these, policy reads them.
"""

from __future__ import annotations

import enum
import posixpath
import re
import unicodedata
from collections import ChainMap
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import NamedTuple, NewType, cast

StreamKey = NewType("StreamKey", str)
GroupName = NewType("GroupName", str)
ConsumerName = NewType("ConsumerName", str)
AgentId = NewType("AgentId", str)
EntryId = NewType("EntryId", str)
PodName = NewType("PodName", str)

# The agent of a consumer that resolves to no known agent, where one must be named (labels).
UNKNOWN_AGENT = "unknown"

# The `reason` of a dead letter written because its deliveries reached RIG_MAX_DELIVERIES, by the
# reaper (step 7) and by an operator's move of such an entry.
DEAD_LETTER_REASON = "max-deliveries"

# A stream entry id as Redis takes it: `<ms>-<seq>`, ASCII digits, each part at most 2^64-1.
ENTRY_ID_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"
ENTRY_ID_MAX_LENGTH = 41
MAX_ID_PART = 2**64 - 1
_ENTRY_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def entry_id(text: str) -> EntryId:
    """`text` as a stream entry id; ValueError saying why when Redis would refuse it.

    The one check every route, form and cursor that takes an id goes through: a pattern alone
    lets `99999999999999999999-1` through, which Redis answers with an error.
    """
    if not isinstance(text, str) or not _ENTRY_ID.fullmatch(text):
        raise ValueError("is not a stream entry id (<milliseconds>-<sequence>, e.g. 1700000000-0)")
    milliseconds, _, sequence = text.partition("-")
    if int(milliseconds) > MAX_ID_PART or int(sequence) > MAX_ID_PART:
        raise ValueError(f"is not a stream entry id: each part must be at most {MAX_ID_PART}")
    return EntryId(text)


# Control characters (C0, DEL, C1) and the Unicode line and paragraph separators: what splits
# or garbles a log line, a terminal or a page. Names may not hold them; the text log escapes them.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
NAME_MAX_LENGTH = 200


def name(text: str) -> str:
    """`text` as a name (agent id, consumer, stream, group); ValueError saying why it is not one.

    1..NAME_MAX_LENGTH characters without control characters and without Unicode format
    characters (category Cf: bidi overrides such as U+202E, zero-width ones such as U+200B): a
    name ends up in log lines, metric labels and console pages, where a newline would forge a
    line of its own and a format character would make one name look like another.
    """
    if not isinstance(text, str) or not 1 <= len(text) <= NAME_MAX_LENGTH:
        raise ValueError(f"must be 1 to {NAME_MAX_LENGTH} characters")
    if (found := CONTROL.search(text)) is not None:
        raise ValueError(f"must not contain control characters (found {found.group()!r})")
    if not text.isascii():  # ASCII has no format character: most names stop here
        for char in text:
            if unicodedata.category(char) == "Cf":
                raise ValueError(
                    f"must not contain Unicode format characters (found U+{ord(char):04X})"
                )
    return text


class PodState(enum.Enum):
    """What Kubernetes says about the pod a consumer is named after."""

    LIVE = "live"
    # Seen as a pod of the namespace + selector (by this conductor or an earlier leader), and
    # now finished, deleted, or missing from a successful list.
    GONE = "gone"
    # Never seen, missing from a successful list, and 404 by name: gone, unless the consumer
    # heartbeats by its own name (an agent outside the cluster).
    ABSENT = "absent"
    # Missing from a successful list and not looked up by name (it holds nothing to reclaim):
    # never treated as gone, and never a reclaim target unless it heartbeats by its own name.
    MISSING = "missing"
    # No answer, a failed call, or no Kubernetes at all. Never treated as gone.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Pods:
    """What Kubernetes said about the pods consumers are named after, as one answer: each pod's
    state, and whether they come from a successful list (then a pod they do not name is
    MISSING: no reclaim target unless it heartbeats by its own name, rule 5 of docs/rules.md)."""

    states: Mapping[ConsumerName, PodState] = field(default_factory=dict)
    listed: bool = False

    @property
    def default(self) -> PodState:
        """The state of a pod `states` does not name."""
        return PodState.MISSING if self.listed else PodState.UNKNOWN

    def adding(self, states: Mapping[ConsumerName, PodState]) -> Pods:
        """This answer with the states of more pods (looked up by name) over it."""
        return Pods({**self.states, **states}, self.listed) if states else self


class EventKind(enum.StrEnum):
    """What an event-log row records, and the `type` of an event sent to `POST /api/events`.

    The values are stored in `events.kind` and sent on the wire: never rename one.
    """

    # Sent by agents and the dispatcher (the API's event types).
    HEARTBEAT = "HEARTBEAT"  # logged before revision 0013; now kept as liveness intervals
    ISSUE_ASSIGNED = "ISSUE_ASSIGNED"
    WORK_STARTED = "WORK_STARTED"
    WORK_PROGRESS = "WORK_PROGRESS"
    WORK_COMPLETED = "WORK_COMPLETED"
    WORK_FAILED = "WORK_FAILED"
    WORK_PUBLISHED = "WORK_PUBLISHED"
    DEAD_LETTER = "DEAD_LETTER"  # a request only: what it does is logged as DEAD_LETTERED
    # Written by the conductor.
    RECLAIMED = "RECLAIMED"
    DEAD_LETTERED = "DEAD_LETTERED"
    DEAD_LETTER_REQUEUED = "DEAD_LETTER_REQUEUED"
    DEAD_LETTER_DELETED = "DEAD_LETTER_DELETED"
    CONSUMER_WITHOUT_HEARTBEAT = "CONSUMER_WITHOUT_HEARTBEAT"
    SCAN_REQUESTED = "SCAN_REQUESTED"
    SIGN_IN_FAILED = "SIGN_IN_FAILED"
    AUDIT_COMPLETED = "AUDIT_COMPLETED"

    def __repr__(self) -> str:
        # As the wire spells it: pydantic lists a union's tags by repr in its 422 messages.
        return repr(self.value)


class AssignmentState(enum.StrEnum):
    """Where one entry's attempts stand (`assignments.state`, `group_assignments.state`).

    The values are stored, and the tables' CHECK constraints list them: never rename one.
    """

    PENDING = "pending"  # an attempt reserved for a consumer (a reclaim's target), not started
    RUNNING = "running"
    FAILED = "failed"  # the current attempt failed; the entry may run again
    DONE = "done"
    DEAD = "dead"  # dead-lettered
    SUPERSEDED = "superseded"  # Redis lost the entry; its dispatch lives on as a new entry


# An entry in one of these states is never started or reclaimed again.
CLOSED_STATES = (AssignmentState.DONE, AssignmentState.DEAD, AssignmentState.SUPERSEDED)


@dataclass(frozen=True, slots=True)
class Limits:
    """The reaper's thresholds: RIG_ENTRY_STALE_MS, RIG_AGENT_DOWN_MS, RIG_MAX_DELIVERIES,
    RIG_RECLAIM_DEGRADED with RIG_DEGRADED_GRACE_MS, and RIG_ENTRY_DEADLINE_MS (0 = off)."""

    entry_stale_ms: int = 300_000
    agent_down_ms: int = 600_000
    max_deliveries: int = 5
    reclaim_degraded: bool = True
    degraded_grace_ms: int = 300_000
    entry_deadline_ms: int = 3_600_000
    # How long after a replica's last listening mark it still counts as hearing: the marks come
    # four times as often, so this only absorbs a slow mark (see `policy.blind`).
    listen_slack_ms: int = 5_000


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The latest heartbeat of an agent or of one consumer, stamped with the server's clock,
    with the facts rule 3b decides on (`policy.degraded`)."""

    at: datetime
    degraded: bool = False
    # Receipt time of the first of the heartbeats since which every one has reported this
    # `degraded`, whatever the gaps between them; None when not known. A consumer's: of the
    # heartbeats naming it. An agent's is not kept (see `anonymous`). The scan reads it for a
    # degraded heartbeat only (`queries._own_heartbeats`): nothing asks since when one is healthy.
    status_since: datetime | None = None
    # An agent's: its latest heartbeat that named no consumer, with its own `status_since`;
    # None when none was heard (and for a consumer).
    anonymous: Heartbeat | None = None


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """One row of XINFO CONSUMERS."""

    name: ConsumerName
    pending: int
    idle_ms: int
    # Redis 7.2+ only: time since the last successful read or claim.
    inactive_ms: int | None = None


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group of one stream, as XINFO GROUPS and XINFO CONSUMERS describe it."""

    stream: StreamKey
    name: GroupName
    pending: int
    consumers: tuple[ConsumerInfo, ...]
    # The pending entry with the lowest id, and its idle time: None when nothing is pending.
    oldest_id: EntryId | None = None
    oldest_idle_ms: int | None = None
    # How many consumers the group has, when `consumers` lists only some of them (a scan's
    # summary: those holding entries and a few others); None when it lists them all.
    count: int | None = None
    # Entries of the stream not yet delivered to the group; None when unknown.
    lag: int | None = None

    @property
    def consumer_count(self) -> int:
        return len(self.consumers) if self.count is None else self.count

    @property
    def complete(self) -> bool:
        """Whether `consumers` lists every consumer of the group."""
        return self.count is None or self.count == len(self.consumers)

    @property
    def oldest_id_ms(self) -> int | None:
        """The Redis time the oldest pending entry was added (its id's first part)."""
        if self.oldest_id is None:
            return None
        head = self.oldest_id.partition("-")[0]
        return int(head) if head.isdigit() else None


class PendingEntry(NamedTuple):
    """One row of the extended XPENDING form. A tuple: a scan may hold a million of them."""

    id: EntryId
    consumer: ConsumerName
    idle_ms: int
    deliveries: int


@dataclass(frozen=True, slots=True)
class Span:
    """A stretch of time, `start` to `end`, on PostgreSQL's clock."""

    start: datetime
    end: datetime


# Where a move put entries: the (stream, group, consumer) a reclaim targeted.
MoveKey = tuple[StreamKey, GroupName, ConsumerName]


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything a scan knows about who is alive, read at one instant `now`.

    `now` comes from the same clock that stamped the heartbeats (PostgreSQL's), so replicas with
    skewed clocks still agree on who is down.
    """

    now: datetime
    known_agents: frozenset[AgentId]
    agent_heartbeats: Mapping[AgentId, Heartbeat] = field(default_factory=dict)
    consumer_heartbeats: Mapping[ConsumerName, Heartbeat] = field(default_factory=dict)
    pods: Mapping[ConsumerName, PodState] = field(default_factory=dict)
    # The state of a pod `pods` does not name: MISSING when they come from a successful list.
    pods_default: PodState = PodState.UNKNOWN
    # When some conductor sharing the database was taking heartbeats in: every replica's
    # listening marks, as spans (rule 3's blind spells are the gaps between them).
    heard: tuple[Span, ...] = ()
    # The latest move the conductor itself made to each (stream, group, consumer), within
    # RIG_AGENT_DOWN_MS: an XCLAIM resets its target's idle time, which is then no evidence.
    moved_to: Mapping[MoveKey, datetime] = field(default_factory=dict)
    # When the reading of Redis (the idle times) began, on the same clock; None: `now`.
    read_at: datetime | None = None

    def __post_init__(self) -> None:
        # Frozen in fact, not only in its fields: the scan's groups are judged side by side on
        # one evidence, so no mapping of it may change under them. A mutable one is wrapped
        # (not copied: a scan's holds a heartbeat per consumer).
        for name in ("agent_heartbeats", "consumer_heartbeats", "pods", "moved_to"):
            value = getattr(self, name)
            if isinstance(value, MutableMapping):
                object.__setattr__(self, name, MappingProxyType(value))

    def pod(self, consumer: ConsumerName) -> PodState:
        return self.pods.get(consumer, self.pods_default)

    def adding(self, consumer_heartbeats: Mapping[ConsumerName, Heartbeat]) -> Evidence:
        """This evidence with more consumers' own heartbeats (read since), itself unchanged: the
        new ones are laid over its own, not copied into them."""
        if not consumer_heartbeats:
            return self
        own = cast(MutableMapping[ConsumerName, Heartbeat], self.consumer_heartbeats)
        # ChainMap writes to its first map only, and the proxy lets nothing write: `own` is read.
        beats = MappingProxyType(ChainMap(dict(consumer_heartbeats), own))
        return replace(self, consumer_heartbeats=beats)


@dataclass(frozen=True, slots=True)
class Progress:
    """Rule 4b's evidence for one group: entries whose current attempt made progress within
    RIG_ENTRY_DEADLINE_MS (`fresh`), and those whose last progress is older (`stale`). Entries
    in neither were never named by a WORK_* event and are judged by their idle time."""

    fresh: frozenset[EntryId] = frozenset()
    stale: frozenset[EntryId] = frozenset()


class StagedOutput(NamedTuple):
    """One file an attempt staged: written at `staged`, published by renaming it onto `path`.
    An accepted completion records its outputs; they are published exactly once (WORK_PUBLISHED)."""

    staged: str
    path: str


# `entry.stage(path)`: the file is written beside its final path, hidden and named after the entry
# and attempt, `.<name>.<entryId>.a<attempt>.tmp`, so the rename that publishes it stays on one
# filesystem and two attempts never share a temporary file. The name is cut to keep the whole
# under the usual 255-byte limit.
STAGED_NAME_MAX = 200
_STAGED_SUFFIX = re.compile(r"\.([0-9]{1,20}-[0-9]{1,20})\.a([0-9]{1,9})\.tmp")


def staged_path(path: str, *, entry_id: str, attempt: int) -> str:
    """Where attempt `attempt` of `entry_id` stages the file it publishes at `path`."""
    directory, base = posixpath.split(path)
    return posixpath.join(directory, f".{base[:STAGED_NAME_MAX]}.{entry_id}.a{attempt}.tmp")


def staged_output(staged: str, path: str, *, attempt: int) -> StagedOutput:
    """`(staged, path)` as a recorded output of attempt `attempt`; ValueError saying why not.

    A publish renames `staged` onto `path`, so both are checked before anything is renamed:
    `path` absolute and normalised, naming a file; `staged` the temporary `staged_path` gives
    it for that attempt (of any entry: a dispatch appended again after Redis lost its data is
    finished under a new entry id), so a rename only ever moves a staging temporary.
    """
    if "\x00" in staged + path or not posixpath.isabs(path) or posixpath.normpath(path) != path:
        raise ValueError(f"path {path!r} is not absolute and normalised")
    directory, base = posixpath.split(path)
    if not base:
        raise ValueError(f"path {path!r} names no file")
    prefix = posixpath.join(directory, f".{base[:STAGED_NAME_MAX]}")
    suffix = _STAGED_SUFFIX.fullmatch(staged[len(prefix) :]) if staged.startswith(prefix) else None
    if suffix is None or int(suffix.group(2)) != attempt:
        expected = staged_path(path, entry_id="<entryId>", attempt=attempt)
        raise ValueError(f"staged file {staged!r} is not {expected!r}")
    return StagedOutput(staged, path)


class NotLeading(Exception):
    """A change (a non-dry scan) asked of a replica that is not the active reaper."""


@dataclass(frozen=True, slots=True)
class ConsumerMeasure:
    """One of a group's consumers holding the most entries, as the last scan saw it."""

    name: str
    pending: int
    idle_ms: int
    agent_id: str | None


@dataclass(frozen=True, slots=True)
class GroupMeasure:
    """A group as the last scan measured it: what the views show without reading Redis."""

    stream: str
    group: str
    pending: int
    consumers: int
    consumers_down: int  # consumers holding entries that rule 3 (docs/rules.md) judges down
    held_by_down: int  # the entries those consumers hold
    oldest_idle_ms: int | None
    top: tuple[ConsumerMeasure, ...]  # most pending first, at most TOP_CONSUMERS
    dead_letters: int = 0  # in the stream's dead-letter stream


@dataclass(frozen=True, slots=True)
class FleetMeasure:
    """The agents as the last scan judged them (down outranks degraded)."""

    up: int
    down: int
    degraded: int
