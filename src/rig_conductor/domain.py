"""The nouns of the conductor: typed identifiers and the immutable facts a scan works on.

Plain data only. No I/O, no clock: adapters build these, policy reads them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, NewType

StreamKey = NewType("StreamKey", str)
GroupName = NewType("GroupName", str)
ConsumerName = NewType("ConsumerName", str)
AgentId = NewType("AgentId", str)
EntryId = NewType("EntryId", str)
PodName = NewType("PodName", str)


class PodState(enum.Enum):
    """What Kubernetes says about the pod a consumer is named after."""

    LIVE = "live"
    GONE = "gone"
    # No answer, a failed call, or no Kubernetes at all. Never treated as gone.
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Limits:
    """The reaper's thresholds (RIG_ENTRY_STALE_MS, RIG_AGENT_DOWN_MS, RIG_MAX_DELIVERIES)."""

    entry_stale_ms: int = 300_000
    agent_down_ms: int = 600_000
    max_deliveries: int = 5


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The latest heartbeat of an agent or of one consumer, stamped with the server's clock."""

    at: datetime
    degraded: bool = False


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


class PendingEntry(NamedTuple):
    """One row of the extended XPENDING form. A tuple: a scan may hold a million of them."""

    id: EntryId
    consumer: ConsumerName
    idle_ms: int
    deliveries: int


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

    def pod(self, consumer: ConsumerName) -> PodState:
        return self.pods.get(consumer, PodState.UNKNOWN)
