"""The detector: pending entries with neither the consumer's nor its agent's fresh heartbeat."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    Evidence,
    GroupInfo,
    GroupName,
    Heartbeat,
    Limits,
    StreamKey,
)
from rig_conductor.policy.detector import pending_by_agent, without_heartbeat
from rig_conductor.policy.liveness import Fleet

NOW = datetime(2026, 5, 16, tzinfo=UTC)
LIMITS = Limits(agent_down_ms=600_000)


def beat(age_s: float) -> Heartbeat:
    return Heartbeat(NOW - timedelta(seconds=age_s))


def group(**pending: int) -> GroupInfo:
    consumers = tuple(
        ConsumerInfo(ConsumerName(c.replace("_", "-")), n, 10) for c, n in pending.items()
    )
    return GroupInfo(
        StreamKey("assignments:review-e"), GroupName("agents"), sum(pending.values()), consumers
    )


EVIDENCE = Evidence(
    now=NOW,
    known_agents=frozenset({AgentId("review-e"), AgentId("review-e-codex"), AgentId("dev-e")}),
    agent_heartbeats={AgentId("review-e"): beat(30), AgentId("review-e-codex"): beat(900)},
    consumer_heartbeats={ConsumerName("stray-1"): beat(5), ConsumerName("review-e-0"): beat(900)},
)


@pytest.mark.parametrize(
    ("consumer", "flagged"),
    [
        ("review-e-codex-rig-agent-runtime-0", True),  # its agent went silent (the incident)
        ("review-e-rig-agent-runtime-0", False),  # agent fresh
        ("review-e-0", False),  # own heartbeat stale, but its agent's is fresh
        ("dev-e-0", True),  # agent never heartbeated
        ("stray-0", True),  # unknown agent, no heartbeat of its own: the actuator cannot judge it
        ("stray-1", False),  # unknown agent, but its own heartbeat is fresh
    ],
)
def test_flags_consumers_holding_entries_without_heartbeat(consumer: str, flagged: bool) -> None:
    g = GroupInfo(StreamKey("s"), GroupName("g"), 3, (ConsumerInfo(ConsumerName(consumer), 3, 10),))
    sightings = without_heartbeat(g, Fleet(EVIDENCE, LIMITS))
    assert bool(sightings) is flagged
    if flagged:
        assert (sightings[0].consumer, sightings[0].pending) == (consumer, 3)


def test_consumers_without_entries_are_not_flagged() -> None:
    g = GroupInfo(
        StreamKey("s"), GroupName("g"), 0, (ConsumerInfo(ConsumerName("dev-e-0"), 0, 10),)
    )
    assert without_heartbeat(g, Fleet(EVIDENCE, LIMITS)) == []


def test_pending_by_agent() -> None:
    g = group(review_e_codex_0=4, review_e_1=2, review_e_2=1, stray_0=5, dev_e_0=0)
    assert pending_by_agent(g, Fleet(EVIDENCE, LIMITS)) == {
        "review-e-codex": 4,
        "review-e": 3,
        None: 5,
    }
