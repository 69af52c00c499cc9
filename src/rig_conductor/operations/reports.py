"""What an event may say, by who sent it: the checks behind POST /api/events.

- A bound credential speaks only for itself (`policy.speaking`), against the agents known now.
- A WORK_STARTED comes from a consumer that holds the entry in a pending list; the other
  reports come from the consumer that owns the attempt they name (`work.record_work` checks
  that in the same statement that applies them).

A refused event changes nothing: no heartbeat row, no registry entry, no attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rig_conductor.adapters.postgres import work
from rig_conductor.adapters.redis import holders as redis_holders
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.domain import AgentId, EntryId, EventKind, StreamKey
from rig_conductor.policy import speaking
from rig_conductor.policy.agents import AgentIndex

if TYPE_CHECKING:
    from rig_conductor.runtime import Runtime

# How stale the registry may be when a bound credential's consumer is resolved: an agent id
# first heard by another replica is known here this much later at most.
REGISTRY_MAX_AGE_S = 5.0


class KnownAgents:
    """The agent ids consumer names resolve against (rule 2, docs/rules.md) while the API runs: the
    configured ones (`Settings.known_agents`: RIG_AGENT_IDS and the holders of bound tokens, as
    for the reaper), the registry in PostgreSQL (what every replica heard and the reaper has not
    forgotten), read again when older than `max_age_s`, and the ones heard here since the
    registry was last read.

    Only bound credentials ask for the index, so a fleet on unbound tokens never reads it. What
    is heard here is kept only until a read of the registry that started after it: that read
    holds it (the heartbeat was stored first), or the registry forgot it since
    (RIG_AGENT_FORGET_MS), and then it is forgotten here too. While nobody asks for the index,
    nothing is kept at all: the next ask reads the registry anew.
    """

    def __init__(
        self,
        registry: Callable[[], Awaitable[Iterable[str]]],
        *,
        configured: Iterable[str],
        max_age_s: float = REGISTRY_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_registry = registry
        self._configured = frozenset(AgentId(agent) for agent in configured if agent)
        # Heard here since the registry was last read: agent -> clock() when heard.
        self._heard: dict[AgentId, float] = {}
        self._registry: frozenset[AgentId] = frozenset()
        self._max_age_s = max_age_s
        self._clock = clock
        self._read_at: float | None = None
        self._index: AgentIndex | None = None
        self._lock = asyncio.Lock()

    def heard(self, agent: str) -> None:
        """An accepted (stored) heartbeat's agent: known at once, without waiting for the next
        read of the registry."""
        if self._stale() and not self._lock.locked():
            # The next index() reads the registry before it answers, and the registry holds
            # this agent: nothing to keep (so a fleet nobody asks about costs no memory).
            self._heard.clear()
            return
        if agent not in self._heard and agent not in self._registry:
            self._heard[AgentId(agent)] = self._clock()
            self._index = None

    async def index(self) -> AgentIndex:
        if self._stale():
            async with self._lock:
                if self._stale():
                    started = self._clock()
                    self._registry = frozenset(map(AgentId, await self._read_registry()))
                    self._read_at = self._clock()
                    # What was heard before the read began is in it, or was forgotten since.
                    self._heard = {a: at for a, at in self._heard.items() if at >= started}
                    self._index = None
        if self._index is None:
            self._index = AgentIndex(self._configured | self._registry | self._heard.keys())
        return self._index

    def _stale(self) -> bool:
        return self._read_at is None or self._clock() - self._read_at >= self._max_age_s


async def refusal(
    known: KnownAgents,
    binding: speaking.Binding,
    *,
    agent_id: str,
    consumer: str | None,
    work: bool,
) -> str | None:
    """Why a bound credential may not send this event (None: it may)."""
    index = await known.index()
    return speaking.refusal(binding, agent_id=agent_id, consumer=consumer, work=work, index=index)


async def not_held(
    redis: AnyRedis, *, stream: str, group: str, entry_id: str, consumer: str
) -> str | None:
    """Why `consumer` may not start `entry_id` in `group` (None: it holds it there)."""
    holder = await redis_holders.held_in_group(
        redis, stream=StreamKey(stream), group=group, entry_id=EntryId(entry_id)
    )
    if holder is not None and holder[0] == consumer:
        return None
    if holder is None:
        return f"no consumer of group {group} holds entry {entry_id} on {stream}: nothing to start"
    return f"consumer {consumer} does not hold entry {entry_id} in group {group} of {stream}"


@dataclass(frozen=True, slots=True)
class LegacyGroup:
    """The group an event of the previous release (no `group`) is taken for: `group` (None: the
    first lane, as the previous release would), or why none can be told (`problem`)."""

    group: str | None
    problem: str | None = None
    # A start from a consumer that holds the entry in no group: why it is refused (409).
    refusal: str | None = None


def _not_holding(stream: str, entry_id: str, consumer: str, holders: dict[Any, Any]) -> str:
    if not holders:
        return f"no consumer holds entry {entry_id} on {stream}: nothing to start"
    return f"consumer {consumer} does not hold entry {entry_id} on {stream}"


async def legacy_group(
    rt: Runtime,
    *,
    kind: EventKind,
    stream: str,
    entry_id: str,
    consumer: str,
    attempt: int | None,
) -> LegacyGroup:
    """The one group in which `consumer` holds the entry (a start), or made the attempt the
    event names (the other reports). More than one: the event must name its group."""
    if kind == EventKind.WORK_STARTED:
        found = await redis_holders.holders_by_group(
            rt.redis, stream=StreamKey(stream), entry_id=EntryId(entry_id)
        )
        if found is None:
            return LegacyGroup(None, f"{stream} has too many groups to search: name the group")
        names: list[str | None] = [group for group, holder in found.items() if holder == consumer]
        if not names:
            return LegacyGroup(None, refusal=_not_holding(stream, entry_id, consumer, found))
    else:
        names = await work.groups_of_attempt(
            rt.engine,
            tenant=rt.settings.tenant,
            stream=stream,
            entry_id=entry_id,
            consumer=consumer,
            attempt=attempt,
        )
    if len(names) > 1:
        listed = ", ".join(sorted(str(name) for name in names))
        return LegacyGroup(
            None, f"{consumer} works on entry {entry_id} in groups {listed}: name the group"
        )
    return LegacyGroup(names[0] if names else None)
