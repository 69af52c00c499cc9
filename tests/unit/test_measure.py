"""What a scan measures for the views (`policy.measure`): pure, no database, no clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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
from rig_conductor.policy.measure import (
    TOP_CONSUMERS,
    measure_fleet,
    measure_group,
    measure_groups,
)

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
LIMITS = Limits(agent_down_ms=60_000, entry_stale_ms=0)
FRESH, STALE = Heartbeat(NOW - timedelta(seconds=5)), Heartbeat(NOW - timedelta(minutes=10))


def fleet(**beats: Heartbeat) -> Fleet:
    agents = {AgentId(a): beat for a, beat in beats.items()}
    known = Evidence(NOW, frozenset(agents), agent_heartbeats=agents)
    return Fleet(known, LIMITS)


def group(*consumers: tuple[str, int], oldest_idle_ms: int | None = 900) -> GroupInfo:
    infos = tuple(ConsumerInfo(ConsumerName(name), pending, 10) for name, pending in consumers)
    pending = sum(p for _, p in consumers)
    return GroupInfo(StreamKey("s"), GroupName("g"), pending, infos, oldest_idle_ms=oldest_idle_ms)


def test_down_is_counted_among_the_consumers_holding_entries() -> None:
    seen = fleet(live=FRESH, dead=STALE)
    found = measure_group(group(("live-0", 3), ("dead-0", 4), ("dead-1", 0), ("dead-2", 2)), seen)
    assert (found.pending, found.consumers) == (9, 4)
    # dead-1 holds nothing: judging it would cost a quiet fleet's scan, and it loses no work.
    assert (found.consumers_down, found.held_by_down) == (2, 6)
    assert found.oldest_idle_ms == 900


def test_the_consumers_listed_hold_the_most_first_then_others_by_name() -> None:
    holders = [(f"live-{n:02}", n) for n in range(1, 16)]
    found = measure_group(group(*holders), fleet(live=FRESH))
    assert [c.pending for c in found.top] == list(range(15, 15 - TOP_CONSUMERS, -1))
    assert {c.agent_id for c in found.top} == {"live"}

    quiet = measure_group(group(("live-b", 0), ("live-a", 0), ("live-c", 2)), fleet(live=FRESH))
    # Redis lists consumers by name; the ones holding nothing follow in that order.
    assert [(c.name, c.pending) for c in quiet.top] == [("live-c", 2), ("live-b", 0), ("live-a", 0)]


def test_a_group_of_a_million_lists_ten_and_counts_them_all() -> None:
    many = group(*((f"live-{n:07}", 0) for n in range(1_000_000)), oldest_idle_ms=None)
    found = measure_group(many, fleet(live=FRESH))
    assert (found.consumers, len(found.top), found.consumers_down) == (1_000_000, 10, 0)
    assert found.top[0].name == "live-0000000"


def test_dead_letters_are_the_streams() -> None:
    other = GroupInfo(StreamKey("t"), GroupName("g"), 0, ())
    found = measure_groups([group(), other], fleet(), {StreamKey("s"): 7})
    assert [(m.stream, m.dead_letters) for m in found] == [("s", 7), ("t", 0)]


def test_agents_up_down_and_degraded() -> None:
    sick = Heartbeat(NOW - timedelta(seconds=1), degraded=True, status_since=NOW)
    # A degraded agent that is also silent counts as down: down outranks degraded.
    silent_sick = Heartbeat(NOW - timedelta(hours=1), degraded=True, status_since=NOW)
    found = measure_fleet(fleet(a=FRESH, b=STALE, c=sick, d=silent_sick, e=FRESH))
    assert (found.up, found.down, found.degraded) == (2, 2, 1)
