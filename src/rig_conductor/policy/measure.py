"""What a scan measures for the views: each group's figures and the agents' states, from the
evidence the scan judged with. Pure: the scan stores the result, the views read it.

Only consumers holding entries are judged: at a million quiet consumers, judging each one again
would cost the scan seconds for a figure nobody acts on (a down consumer that holds nothing
loses no work).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping

from rig_conductor.domain import ConsumerMeasure, FleetMeasure, GroupInfo, GroupMeasure, StreamKey
from rig_conductor.policy.liveness import Fleet

# Consumers listed per group: the ones holding the most entries, then others by name.
TOP_CONSUMERS = 10


def measure_group(group: GroupInfo, fleet: Fleet, *, dead_letters: int = 0) -> GroupMeasure:
    holders = [c for c in group.consumers if c.pending]
    down = [c for c in holders if fleet.is_down(c.name)]
    top = heapq.nsmallest(TOP_CONSUMERS, holders, key=lambda c: (-c.pending, c.name))
    if len(top) < TOP_CONSUMERS:  # then the first by name that hold nothing (XINFO's order)
        idle = (c for c in group.consumers if not c.pending)
        top += itertools.islice(idle, TOP_CONSUMERS - len(top))
    return GroupMeasure(
        stream=group.stream,
        group=group.name,
        pending=group.pending,
        consumers=group.consumer_count,
        consumers_down=len(down),
        held_by_down=sum(c.pending for c in down),
        oldest_idle_ms=group.oldest_idle_ms,
        top=tuple(
            ConsumerMeasure(c.name, c.pending, c.idle_ms, fleet.agent_of(c.name)) for c in top
        ),
        dead_letters=dead_letters,
    )


def measure_groups(
    groups: Iterable[GroupInfo], fleet: Fleet, dead_letters: Mapping[StreamKey, int]
) -> list[GroupMeasure]:
    """Every group; `dead_letters`: per stream, the length of its dead-letter stream."""
    return [
        measure_group(group, fleet, dead_letters=dead_letters.get(group.stream, 0))
        for group in groups
    ]


def agent_state(*, down: bool, degraded: bool) -> str:
    """An agent's state as the views show it: down outranks degraded."""
    if down:
        return "down"
    return "degraded" if degraded else "up"


def measure_fleet(fleet: Fleet) -> FleetMeasure:
    """How many known agents are up, down and degraded (by their latest heartbeat), each judged
    as the agents' views judge it (`agent_state`)."""
    beats = fleet.evidence.agent_heartbeats
    states = [
        agent_state(
            down=not fleet.agent_up(agent),
            degraded=(beat := beats.get(agent)) is not None and beat.degraded,
        )
        for agent in fleet.evidence.known_agents
    ]
    return FleetMeasure(states.count("up"), states.count("down"), states.count("degraded"))
