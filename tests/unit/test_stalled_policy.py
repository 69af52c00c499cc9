"""Rule 4b: an entry of an alive owner that made no progress within RIG_ENTRY_DEADLINE_MS is
moved on its own; the owner keeps the rest. Pure: no Redis, no database, no clock."""

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
    Progress,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from tests import reclaim_kit

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
DEADLINE_MS = 60_000
LIMITS = Limits(entry_deadline_ms=DEADLINE_MS)
HUNG, OTHER = ConsumerName("dev-e-0"), ConsumerName("dev-e-1")
OLD_ID = f"{int((NOW - timedelta(hours=2)).timestamp() * 1000)}-0"


def plan(
    idle_ms: int,
    *,
    fresh: set[str] = frozenset(),  # type: ignore[assignment]
    stale: set[str] = frozenset(),  # type: ignore[assignment]
    limits: Limits = LIMITS,
    deliveries: int = 1,
    others: tuple[ConsumerName, ...] = (OTHER,),
    oldest_id: str = OLD_ID,
) -> reclaim.ReclaimPlan:
    """dev-e-0 is alive and holds `1-0` (idle `idle_ms`) and `2-0` (just read)."""
    evidence = Evidence(
        now=NOW,
        known_agents=frozenset({AgentId("dev-e")}),
        agent_heartbeats={AgentId("dev-e"): Heartbeat(NOW - timedelta(seconds=5))},
    )
    entries = [
        PendingEntry(EntryId("1-0"), HUNG, idle_ms, deliveries),
        PendingEntry(EntryId("2-0"), HUNG, 10, 1),
    ]
    consumers = (ConsumerInfo(HUNG, 2, 10), *(ConsumerInfo(c, 0, 10) for c in others))
    group = GroupInfo(
        StreamKey("rig:dispatch"), GroupName("workers"), 2, consumers, EntryId(oldest_id), idle_ms
    )
    progress = Progress(frozenset(EntryId(e) for e in fresh), frozenset(EntryId(e) for e in stale))
    assessment = reclaim.assess_group(group, Fleet(evidence, limits), progress=progress)
    return reclaim_kit.plan_reclaims(assessment, entries)


def outcome(p: reclaim.ReclaimPlan) -> str:
    if p.moves:
        return " ".join(f"{m.entry.id}:{m.reason}->{m.to}" for m in p.moves)
    if p.dead_letters:
        return "dead-letter " + " ".join(e.id for e in p.dead_letters)
    if p.no_target:
        return "no-target"
    return "leave"


@pytest.mark.parametrize(
    ("idle_ms", "fresh", "stale", "expected"),
    [
        # Never named by a WORK_* event: judged by its idle time.
        (DEADLINE_MS, set(), set(), f"1-0:stalled->{OTHER}"),
        (DEADLINE_MS - 1, set(), set(), "leave"),
        # Progress within the deadline keeps it, however long it has been idle in Redis.
        (10 * DEADLINE_MS, {"1-0"}, set(), "leave"),
        # Last progress older than the deadline moves it, even if it was re-read lately.
        (5, set(), {"1-0"}, f"1-0:stalled->{OTHER}"),
    ],
)
def test_stalled_entry_table(idle_ms: int, fresh: set[str], stale: set[str], expected: str) -> None:
    assert outcome(plan(idle_ms, fresh=fresh, stale=stale)) == expected


def test_deadline_zero_turns_it_off() -> None:
    assert outcome(plan(10 * DEADLINE_MS, limits=Limits(entry_deadline_ms=0))) == "leave"


def test_no_other_consumer_leaves_it_counted() -> None:
    assert outcome(plan(DEADLINE_MS, others=())) == "no-target"


def test_a_worn_stalled_entry_is_dead_lettered() -> None:
    assert outcome(plan(DEADLINE_MS, deliveries=5)) == "dead-letter 1-0"


def test_a_young_group_is_not_read_for_stalls() -> None:
    # The oldest entry was added 5 s ago: nothing can have been idle for 10 min.
    young = f"{int((NOW - timedelta(seconds=5)).timestamp() * 1000)}-0"
    limits = Limits(entry_deadline_ms=600_000)
    p = plan(600_000, oldest_id=young, limits=limits)
    assert p.assessment.rules == {}
    # ... unless a recorded attempt is past the deadline.
    p = plan(5, stale={"1-0"}, oldest_id=young, limits=limits)
    assert outcome(p) == f"1-0:stalled->{OTHER}"
