"""Consumer hygiene: which consumers of a group are dead weight and may be deleted.

A consumer lingers in XINFO CONSUMERS forever after its pod is gone; with pods named
`<agent>-<hash>` every rollout adds more. The reaper deletes one only when all of these hold:

1. it holds no pending entries (XINFO says 0; the Redis side re-checks atomically at delete
   time, because an entry may be claimed to it between the scan and the delete);
2. Kubernetes positively reports its pod gone (PodState.GONE). UNKNOWN never qualifies: a
   failed pod list must not empty the consumer lists;
3. no fresh heartbeat speaks for it. A consumer that has heartbeated by name is judged by its
   own heartbeat only: its agent keeps heartbeating from its other pods after a scale-down, so
   requiring the agent's silence would keep every scaled-down consumer forever. A consumer that
   never named itself in a heartbeat is judged by its agent's heartbeat, since that heartbeat may
   have come from this very consumer; one that resolves to no known agent has nothing speaking
   for it;
4. Redis itself has not seen it for RIG_AGENT_DOWN_MS (XINFO idle): no read or claim by that
   name lately, so no process is still using the name.

Pure: stdlib and domain only. Deleting is the caller's business.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    Evidence,
    GroupInfo,
    GroupName,
    Limits,
    PodState,
    StreamKey,
)
from rig_conductor.policy.agents import resolve_agent
from rig_conductor.policy.liveness import is_fresh


@dataclass(frozen=True, slots=True)
class ConsumerRemoval:
    """A consumer to delete with XGROUP DELCONSUMER, if it still holds nothing."""

    stream: StreamKey
    group: GroupName
    consumer: ConsumerName
    agent: AgentId | None
    idle_ms: int


def removable(info: ConsumerInfo, evidence: Evidence, limits: Limits) -> bool:
    """Whether one consumer meets all four conditions above."""
    if info.pending > 0 or evidence.pod(info.name) not in (PodState.GONE, PodState.ABSENT):
        return False
    if info.idle_ms < limits.agent_down_ms:
        return False
    own = evidence.consumer_heartbeats.get(info.name)
    if own is not None:
        return not is_fresh(own, evidence.now, limits)
    agent = resolve_agent(info.name, evidence.known_agents)
    if agent is None:
        return True
    return not is_fresh(evidence.agent_heartbeats.get(agent), evidence.now, limits)


def plan_removals(
    groups: Iterable[GroupInfo], evidence: Evidence, limits: Limits
) -> list[ConsumerRemoval]:
    """Every removable consumer of every group, in the order the groups list them."""
    return [
        ConsumerRemoval(
            group.stream,
            group.name,
            info.name,
            resolve_agent(info.name, evidence.known_agents),
            info.idle_ms,
        )
        for group in groups
        for info in group.consumers
        if removable(info, evidence, limits)
    ]
