"""The detector: consumers that hold pending entries with no fresh heartbeat behind them.

Deliberately independent of the reclaim plan (`reclaim.py`): it reads the same facts with its
own, simpler rule, so a regression of the actuator (entries that should move and do not) still
shows up as a detector sighting. It also catches what the actuator's rules do not cover, such as
consumers whose names resolve to no known agent.

Pure: stdlib and domain only.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig_conductor.domain import AgentId, ConsumerName, GroupInfo, GroupName, StreamKey
from rig_conductor.policy.liveness import Fleet


@dataclass(frozen=True, slots=True)
class Sighting:
    stream: StreamKey
    group: GroupName
    consumer: ConsumerName
    agent: AgentId | None
    pending: int

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.stream, self.group, self.consumer)


def without_heartbeat(group: GroupInfo, fleet: Fleet) -> list[Sighting]:
    """Consumers with pending entries and neither their own nor their agent's fresh heartbeat."""
    sightings: list[Sighting] = []
    beats = fleet.evidence.consumer_heartbeats
    for info in group.consumers:
        if info.pending == 0:
            continue
        agent = fleet.agent_of(info.name)
        if fleet.fresh(beats.get(info.name)) or (agent is not None and fleet.agent_up(agent)):
            continue
        sightings.append(Sighting(group.stream, group.name, info.name, agent, info.pending))
    return sightings


def pending_by_agent(group: GroupInfo, fleet: Fleet) -> dict[AgentId | None, int]:
    """Pending entries of the group per owning agent (None: no known agent)."""
    totals: dict[AgentId | None, int] = {}
    for info in group.consumers:
        if info.pending:
            agent = fleet.agent_of(info.name)
            totals[agent] = totals.get(agent, 0) + info.pending
    return totals
