"""Consumer hygiene: only empty consumers of gone pods, with nothing alive speaking for them."""

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
    PodState,
    StreamKey,
)
from rig_conductor.policy.hygiene import ConsumerRemoval, plan_removals, removable

NOW = datetime(2026, 5, 16, tzinfo=UTC)
LIMITS = Limits(agent_down_ms=600_000)
DOWN_MS = LIMITS.agent_down_ms
FRESH, STALE = 30, 900  # heartbeat ages in seconds


def beat(age_s: float) -> Heartbeat:
    return Heartbeat(NOW - timedelta(seconds=age_s))


def evidence(
    *,
    pod: PodState | None = PodState.GONE,
    own: float | None = None,
    agent: float | None = None,
    consumer: str = "dev-e-rig-agent-runtime-2",
) -> Evidence:
    return Evidence(
        now=NOW,
        known_agents=frozenset({AgentId("dev-e")}),
        agent_heartbeats={AgentId("dev-e"): beat(agent)} if agent is not None else {},
        consumer_heartbeats={ConsumerName(consumer): beat(own)} if own is not None else {},
        pods={ConsumerName(consumer): pod} if pod is not None else {},
    )


def info(
    consumer: str = "dev-e-rig-agent-runtime-2", *, pending: int = 0, idle_ms: int = DOWN_MS
) -> ConsumerInfo:
    return ConsumerInfo(ConsumerName(consumer), pending, idle_ms)


@pytest.mark.parametrize(
    ("case", "consumer", "facts", "expected"),
    [
        ("gone, empty, silent", info(), evidence(own=STALE, agent=STALE), True),
        ("gone, empty, never heartbeated at all", info(), evidence(), True),
        # Scale-down: its agent lives on in other pods; its own heartbeat speaks for it.
        ("scaled down, agent alive", info(), evidence(own=STALE, agent=FRESH), True),
        ("own heartbeat fresh", info(), evidence(own=FRESH, agent=STALE), False),
        # Never named itself: the agent's fresh heartbeat may be this consumer's own.
        ("nameless, agent fresh", info(), evidence(agent=FRESH), False),
        ("nameless, agent silent", info(), evidence(agent=STALE), True),
        ("still holds entries", info(pending=1), evidence(own=STALE), False),
        ("pod live", info(), evidence(pod=PodState.LIVE, own=STALE), False),
        ("pod unknown (failed list)", info(), evidence(pod=PodState.UNKNOWN, own=STALE), False),
        ("pod never seen", info(), evidence(pod=None, own=STALE), False),
        ("Redis saw it lately", info(idle_ms=DOWN_MS - 1), evidence(own=STALE), False),
        (
            "no known agent, nothing speaks for it",
            info("stray-7"),
            evidence(consumer="stray-7"),
            True,
        ),
    ],
)
def test_removable(case: str, consumer: ConsumerInfo, facts: Evidence, expected: bool) -> None:
    assert removable(consumer, facts, LIMITS) is expected, case


def test_plan_lists_removals_per_group_in_order() -> None:
    gone = ConsumerName("dev-e-rig-agent-runtime-2")
    facts = Evidence(
        now=NOW,
        known_agents=frozenset({AgentId("dev-e")}),
        agent_heartbeats={AgentId("dev-e"): beat(FRESH)},
        consumer_heartbeats={
            gone: beat(STALE),
            ConsumerName("dev-e-rig-agent-runtime-0"): beat(FRESH),
        },
        pods={gone: PodState.GONE, ConsumerName("dev-e-rig-agent-runtime-0"): PodState.LIVE},
    )
    consumers = (
        info("dev-e-rig-agent-runtime-0"),
        info("dev-e-rig-agent-runtime-2", idle_ms=DOWN_MS + 5),
    )
    groups = [
        GroupInfo(StreamKey("rig:dispatch"), GroupName("workers"), 0, consumers),
        GroupInfo(StreamKey("assignments:dev-e"), GroupName("dev"), 1, (info(pending=1),)),
    ]
    assert plan_removals(groups, facts, LIMITS) == [
        ConsumerRemoval(
            StreamKey("rig:dispatch"), GroupName("workers"), gone, AgentId("dev-e"), DOWN_MS + 5
        )
    ]


def test_nothing_is_removable_without_pod_evidence() -> None:
    """A failed pod list yields no pod states at all: hygiene must then do nothing."""
    facts = Evidence(now=NOW, known_agents=frozenset())
    group = GroupInfo(StreamKey("s"), GroupName("g"), 0, (info("a"), info("b"), info("c")))
    assert plan_removals([group], facts, LIMITS) == []
