"""Rule 3b: owners alive but degraded past the grace period lose all their entries, to
non-degraded targets only. Pure: no Redis, no database, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    EntryId,
    Evidence,
    GroupInfo,
    GroupName,
    Heartbeat,
    Limits,
    PendingEntry,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from tests import reclaim_kit

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
GRACE_S = 300
LIMITS = Limits(entry_stale_ms=300_000, agent_down_ms=600_000, degraded_grace_ms=GRACE_S * 1000)
CODEX, CLAUDE = "review-e-codex-0", "review-e-0"


def beat(age_s: float, degraded_for_s: float | None = None) -> Heartbeat:
    """A heartbeat `age_s` old; `degraded_for_s`: the degraded run began that long ago."""
    at = NOW - timedelta(seconds=age_s)
    if degraded_for_s is None:
        return Heartbeat(at)
    return Heartbeat(at, True, NOW - timedelta(seconds=degraded_for_s))


def plan(
    consumer_beats: dict[str, Heartbeat],
    *,
    agent_beats: dict[str, Heartbeat] | None = None,
    limits: Limits = LIMITS,
    idle_ms: int = 1_000,
) -> reclaim.ReclaimPlan:
    """review-e-codex-0 holds 3 entries, just re-read (idle `idle_ms`); review-e-0 is idle."""
    agents = agent_beats or {"review-e-codex": beat(5), "review-e": beat(5)}
    evidence = Evidence(
        now=NOW,
        known_agents=frozenset(AgentId(a) for a in agents),
        agent_heartbeats={AgentId(a): hb for a, hb in agents.items()},
        consumer_heartbeats={ConsumerName(c): hb for c, hb in consumer_beats.items()},
    )
    entries = [PendingEntry(EntryId(f"{i}-0"), ConsumerName(CODEX), idle_ms, 1) for i in (1, 2, 3)]
    group = GroupInfo(
        StreamKey("assignments:review-e"),
        GroupName("review"),
        3,
        (ConsumerInfo(ConsumerName(CODEX), 3, 10), ConsumerInfo(ConsumerName(CLAUDE), 0, 10)),
    )
    return reclaim_kit.plan_reclaims(reclaim.assess_group(group, Fleet(evidence, limits)), entries)


def outcome(p: reclaim.ReclaimPlan) -> str:
    if p.moves:
        return ",".join(sorted({f"{m.reason}->{m.to}" for m in p.moves}))
    if p.assessment.left_degraded:
        return f"held {sum(p.assessment.left_degraded.values())}"
    return "leave"


@pytest.mark.parametrize(
    ("codex", "claude", "expected"),
    [
        # The seed 001 incident: degraded past the grace, healthy sibling idle.
        (beat(5, GRACE_S), beat(5), f"degraded->{CLAUDE}"),
        (beat(5, GRACE_S + 60), beat(5), f"degraded->{CLAUDE}"),
        # Within the grace period: the owner keeps its entries.
        (beat(5, GRACE_S - 1), beat(5), "leave"),
        # Healthy owner.
        (beat(5), beat(5), "leave"),
        # The only other consumer is degraded too: nothing moves, counted as held.
        (beat(5, GRACE_S), beat(5, 10), "held 3"),
        (beat(5, GRACE_S), beat(5, GRACE_S), "held 3"),
    ],
)
def test_degraded_owner_table(codex: Heartbeat, claude: Heartbeat, expected: str) -> None:
    assert outcome(plan({CODEX: codex, CLAUDE: claude})) == expected


def test_idle_time_does_not_matter_for_degraded_owners() -> None:
    # A degraded worker that keeps retrying its entries keeps their idle time near zero.
    p = plan({CODEX: beat(5, GRACE_S), CLAUDE: beat(5)}, idle_ms=0)
    assert [m.entry.id for m in p.moves] == ["1-0", "2-0", "3-0"]


def test_switched_off_by_setting() -> None:
    limits = Limits(degraded_grace_ms=GRACE_S * 1000, reclaim_degraded=False)
    assert outcome(plan({CODEX: beat(5, 9_999), CLAUDE: beat(5)}, limits=limits)) == "leave"


def test_a_flap_starts_a_new_run() -> None:
    # degraded 10 min ago, healthy in between, degraded again 1 min ago: the run is 1 min old.
    assert outcome(plan({CODEX: beat(5, 60), CLAUDE: beat(5)})) == "leave"


def test_agent_heartbeats_without_consumer_decide_for_unnamed_consumers() -> None:
    run = Heartbeat(NOW, True, NOW - timedelta(seconds=GRACE_S))
    agents = {"review-e-codex": Heartbeat(NOW, True, anonymous=run)}
    agents["review-e"] = beat(5)
    # codex never heartbeated by consumer name: its agent's run decides.
    assert outcome(plan({CLAUDE: beat(5)}, agent_beats=agents)) == f"degraded->{CLAUDE}"
    # codex heartbeats by name and says it is healthy: its own heartbeats decide.
    assert outcome(plan({CODEX: beat(5), CLAUDE: beat(5)}, agent_beats=agents)) == "leave"


def test_down_outranks_degraded() -> None:
    # Degraded for long, and silent past RIG_AGENT_DOWN_MS: the reason is `down`.
    p = plan({CODEX: beat(900, 1_000), CLAUDE: beat(5)}, idle_ms=400_000)
    assert outcome(p) == f"down->{CLAUDE}"


def test_a_degraded_stale_consumer_is_never_a_target() -> None:
    agents = {"review-e-codex": beat(900), "review-e": beat(5)}
    # codex is down; the only other consumer is degraded-stale: no target at all.
    p = plan({CODEX: beat(900), CLAUDE: beat(5, GRACE_S)}, agent_beats=agents, idle_ms=400_000)
    assert p.moves == () and len(p.no_target) == 3
