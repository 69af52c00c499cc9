"""Forgetting: which silent agents and consumers leave the registry after RIG_AGENT_FORGET_MS,
and which stay because the reaper still judges someone by them. Pure: stdlib and domain only.

An agent forgotten is one that never sent a heartbeat: down (rule 3, docs/rules.md) as after a week
of silence. A consumer, though, is judged by its own heartbeats first and resolves to an agent
by the known ids. With its row gone, and its agent's too, a consumer that still holds entries
would resolve to nobody and have no evidence against it: no longer down, its entries stranded.
So the rows that still speak against a consumer holding entries stay until it holds nothing
(the reaper moves its entries once it has a target). Agents named in RIG_AGENT_IDS stay
listed whatever happens, so their rows stay too: their last heartbeat is worth showing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from rig_conductor.domain import AgentId, ConsumerName, GroupInfo
from rig_conductor.policy.liveness import Fleet


@dataclass(frozen=True, slots=True)
class Forget:
    """Forget the rows last heard from before `before`, except the ones named to keep."""

    before: datetime
    keep_agents: frozenset[AgentId]
    keep_consumers: frozenset[ConsumerName]


def plan_forgetting(
    groups: Iterable[GroupInfo], fleet: Fleet, *, forget_ms: int, configured: Iterable[str]
) -> Forget:
    """What a scan forgets, judged at the evidence's `now` from the scan's own reading of the
    groups: only rows past the cutoff are named to keep, so the list stays short."""
    evidence = fleet.evidence
    before = evidence.now - timedelta(milliseconds=forget_ms)
    agents = {AgentId(a) for a in configured}
    consumers: set[ConsumerName] = set()
    for group in groups:
        for info in group.consumers:
            if not info.pending:
                continue
            own = evidence.consumer_heartbeats.get(info.name)
            if own is not None and own.at < before:
                consumers.add(info.name)
            agent = fleet.agent_of(info.name)
            beat = evidence.agent_heartbeats.get(agent) if agent is not None else None
            if agent is not None and beat is not None and beat.at < before:
                agents.add(agent)
    return Forget(before, frozenset(agents), frozenset(consumers))
