"""Forgetting (`policy.registry`): silent rows go after RIG_AGENT_FORGET_MS, except those the
reaper still judges a consumer holding entries by, and the agents RIG_AGENT_IDS names."""

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
from rig_conductor.policy.liveness import Fleet
from rig_conductor.policy.registry import plan_forgetting

NOW = datetime(2026, 11, 27, tzinfo=UTC)
DAY_MS = 86_400_000
FORGET_MS = 7 * DAY_MS
LIMITS = Limits(agent_down_ms=600_000)


def beat(days: float) -> Heartbeat:
    return Heartbeat(NOW - timedelta(days=days))


def fleet(agents: dict[str, float], consumers: dict[str, float]) -> Fleet:
    evidence = Evidence(
        now=NOW,
        known_agents=frozenset(AgentId(a) for a in agents),
        agent_heartbeats={AgentId(a): beat(d) for a, d in agents.items()},
        consumer_heartbeats={ConsumerName(c): beat(d) for c, d in consumers.items()},
    )
    return Fleet(evidence, LIMITS)


def group(**pending: int) -> GroupInfo:
    consumers = tuple(
        ConsumerInfo(ConsumerName(c.replace("_", "-")), n, 10) for c, n in pending.items()
    )
    return GroupInfo(StreamKey("rig:dispatch"), GroupName("g"), sum(pending.values()), consumers)


@pytest.mark.parametrize(
    ("agents", "consumers", "groups", "configured", "keep_agents", "keep_consumers"),
    [
        # Silent and holding nothing: everything goes (no names to keep).
        ({"old-e": 8}, {"old-e-0": 8}, [group(old_e_0=0)], (), set(), set()),
        # A consumer holding entries keeps its own row and its agent's: they make it down.
        ({"old-e": 8}, {"old-e-0": 8}, [group(old_e_0=3)], (), {"old-e"}, {"old-e-0"}),
        # Judged by its agent alone (never heartbeated by name): the agent's row stays.
        ({"old-e": 8}, {}, [group(old_e_7=1)], (), {"old-e"}, set()),
        # Fresh rows are never named: the cutoff spares them anyway.
        ({"new-e": 1}, {"new-e-0": 1}, [group(new_e_0=3)], (), set(), set()),
        # A consumer resolving to no agent: its own row stays while it holds entries.
        ({}, {"stray-0": 9}, [group(stray_0=2)], (), set(), {"stray-0"}),
        # Configured agents stay, heard from or not.
        ({"dev-e": 30}, {"dev-e-0": 30}, [], ("dev-e", "qa-e"), {"dev-e", "qa-e"}, set()),
    ],
)
def test_what_a_scan_keeps(
    agents: dict[str, float],
    consumers: dict[str, float],
    groups: list[GroupInfo],
    configured: tuple[str, ...],
    keep_agents: set[str],
    keep_consumers: set[str],
) -> None:
    plan = plan_forgetting(
        groups, fleet(agents, consumers), forget_ms=FORGET_MS, configured=configured
    )
    assert plan.before == NOW - timedelta(days=7)
    assert plan.keep_agents == keep_agents
    assert plan.keep_consumers == keep_consumers


def test_an_agent_forgotten_is_down_as_one_never_heard_from() -> None:
    """Rule 3 after forgetting: the agent's consumers stay down."""
    before = fleet({"old-e": 8}, {})
    after = Fleet(
        Evidence(now=NOW, known_agents=frozenset({AgentId("old-e")})), LIMITS
    )  # configured, its row forgotten
    consumer = ConsumerName("old-e-0")
    assert before.is_down(consumer) and after.is_down(consumer)
