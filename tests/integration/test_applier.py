"""The applier, the one place a reclaim plan takes effect, on a real Redis and PostgreSQL: a dry
run writes nothing; a real run moves only what the min-idle guard lets through, dead-letters
with the contract's fields, logs one line per entry, records rows and counts."""

from __future__ import annotations

import json
import logging

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import domain, logs
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import AgentId, ConsumerName, PendingEntry
from rig_conductor.effects import port
from rig_conductor.metrics import Metrics
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import TargetCandidate
from tests import reclaim_kit

from .helpers import fill, idle_at_least, owners, read, register

S, G = domain.StreamKey("rig:dispatch"), domain.GroupName("workers")
OWNER, TARGET = ConsumerName("dead-0"), ConsumerName("live-0")
MAX_DELIVERIES = 3
LOGGER = logs.RECLAIM_LOGGER


async def held_entries(redis: Redis) -> tuple[list[str], list[PendingEntry]]:
    """Six entries held by a dead consumer, the first two delivered RIG_MAX_DELIVERIES times,
    all idle a second; a live consumer beside it. The ids, and the pending list as read."""
    ids = await fill(redis, S, G, 6)
    await register(redis, S, G, TARGET)
    await read(redis, S, G, OWNER, 6)
    for entry_id in ids[:2]:
        for _ in range(MAX_DELIVERIES - 1):  # XCLAIM without JUSTID counts a delivery
            await redis.xclaim(S, G, OWNER, 0, [entry_id])
    await idle_at_least(redis, S, G, 1000)  # the guard each claim carries: a second or more
    rows = await redis.xpending_range(S, G, min="-", max="+", count=100)
    entries = [
        PendingEntry(
            domain.EntryId(row["message_id"]),
            ConsumerName(row["consumer"]),
            int(row["time_since_delivered"]),
            int(row["times_delivered"]),
        )
        for row in rows
    ]
    return ids, entries


def assessment_of(reason: reclaim.Reason = "down") -> reclaim.GroupAssessment:
    rule = reclaim.OwnerRule(OWNER, AgentId("dead"), reason, 0, MAX_DELIVERIES)
    target = TargetCandidate(TARGET, AgentId("live"), False, 0)
    return reclaim.GroupAssessment(S, G, {OWNER: rule}, (target,))


def lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """Every line of the [StreamReclaim] logger as JSON, one per sentence."""
    formatter = logs.JsonFormatter()
    return [
        json.loads(line)
        for record in caplog.records
        if record.name == LOGGER
        for line in formatter.format(record).splitlines()
    ]


async def pending_state(redis: Redis) -> list[tuple[str, str, int]]:
    rows = await redis.xpending_range(S, G, min="-", max="+", count=100)
    return [(r["message_id"], r["consumer"], r["times_delivered"]) for r in rows]


async def test_a_dry_run_writes_nothing_and_says_what_it_would_do(
    any_redis: Redis, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    ids, entries = await held_entries(any_redis)
    plan = reclaim_kit.plan_reclaims(assessment_of(), entries)
    keys, before = sorted(await any_redis.keys("*")), await pending_state(any_redis)
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger=LOGGER)
    dry = port.choose(True, engine=engine, tenant="default", metrics=metrics)
    applied = await dry.apply(plan, redis=any_redis)
    assert await pending_state(any_redis) == before
    assert sorted(await any_redis.keys("*")) == keys  # no DLQ stream either
    assert (applied.outcome.reclaimed, applied.outcome.dead_lettered) == (4, 2)
    assert applied.moved == ids[2:] and applied.dead_lettered == ids[:2]
    said = [line["message"] for line in lines(caplog)]
    assert said == [
        *(f"[StreamReclaim] DRY RUN: would reclaim {i} on {S}: {OWNER} -> {TARGET} (down)"
          for i in ids[2:]),
        *(f"[StreamReclaim] DRY RUN: would dead-letter {i} on {S} after 3 deliveries"
          for i in ids[:2]),
    ]  # fmt: skip
    async with engine.connect() as conn:
        assert (await conn.execute(select(events))).all() == []
    assert metrics.registry.get_sample_value("rig_reclaimed_entries_total", _moved_labels()) is None


def _moved_labels(reason: str = "down") -> dict[str, str]:
    return {"stream": S, "group": G, "from_agent": "dead", "to_agent": "live", "reason": reason}


async def test_a_real_run_moves_what_the_guard_lets_through_and_dead_letters_the_worn(
    any_redis: Redis, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    ids, entries = await held_entries(any_redis)
    plan = reclaim_kit.plan_reclaims(assessment_of(), entries)
    assert [len(claim.entries) for claim in plan.claims] == [4]  # one XCLAIM, the least idle
    # The owner touches one entry after the plan was made: its idle time drops below the guard.
    await any_redis.xclaim(S, G, OWNER, 0, [ids[3]], justid=True)
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger=LOGGER)
    real = port.choose(False, engine=engine, tenant="default", metrics=metrics)
    applied = await real.apply(plan, redis=any_redis)
    moved = [ids[2], ids[4], ids[5]]
    assert applied.moved == moved and applied.dead_lettered == ids[:2]
    outcome = applied.outcome
    assert (outcome.reclaimed, outcome.dead_lettered, outcome.skipped) == (3, 2, 1)
    assert outcome.targets == {TARGET: 3} and outcome.reclaimed_by_reason == {"down": 3}
    held = await owners(any_redis, S, G)
    assert held == {ids[3]: OWNER, **dict.fromkeys(moved, TARGET)}  # the worn ones acked
    # Dead letters: the contract's fields, then the original ones.
    letters = await any_redis.xrange(redis_streams.dlq_key(S, any_redis))
    assert [fields["originalId"] for _, fields in letters] == ids[:2]
    for _, fields in letters:
        assert fields["stream"] == S and fields["group"] == G and fields["consumer"] == OWNER
        assert fields["deliveries"] == "3" and fields["reason"] == domain.DEAD_LETTER_REASON
        assert fields["type"] == "ISSUE_ASSIGNED" and fields["issueId"].startswith("rc-")
    # One line per entry, in JSON with its parts and reason; the guard's leftovers in one line.
    said = lines(caplog)
    reclaimed = [line for line in said if str(line["message"]).startswith("[StreamReclaim] Recl")]
    assert [line["entryId"] for line in reclaimed] == moved
    assert all(line["reason"] == "down" and line["toConsumer"] == TARGET for line in reclaimed)
    dead = [line for line in said if str(line["message"]).startswith("[StreamReclaim] Dead")]
    assert [line["entryId"] for line in dead] == ids[:2]
    assert [line["message"] for line in said if "Left" in str(line["message"])] == [
        f"[StreamReclaim] Left 1 entries on {S}/{G}: trimmed from the stream or touched since "
        "the scan looked"
    ]
    assert len(said) == len(reclaimed) + len(dead) + 1
    # Counted, and recorded: one RECLAIMED row for the stretch, a DEAD_LETTERED row each.
    sample = metrics.registry.get_sample_value
    assert sample("rig_reclaimed_entries_total", _moved_labels()) == 3
    assert sample("rig_dead_lettered_entries_total", {"stream": S, "group": G}) == 2
    async with engine.connect() as conn:
        rows = (await conn.execute(select(events).order_by(events.c.id))).all()
    assert [row.kind for row in rows] == ["RECLAIMED", "DEAD_LETTERED", "DEAD_LETTERED"]
    assert rows[0].entry_ids == moved and rows[0].detail["reason"] == "down"
    assert "by" not in rows[0].detail and rows[0].detail["count"] == 3
    assert [row.entry_id for row in rows[1:]] == ids[:2]
    assert rows[1].detail["dlqStream"] == redis_streams.dlq_key(S, any_redis)


async def test_a_move_by_hand_guards_each_entry_and_records_one_row_naming_who(
    redis: Redis, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    ids, entries = await held_entries(redis)
    plan = reclaim.plan_by_hand(assessment_of("manual"), entries, target=TARGET)
    assert [len(claim.entries) for claim in plan.claims] == [1, 1, 1, 1]  # a guard each
    await redis.xclaim(S, G, OWNER, 0, [ids[3]], justid=True)
    metrics = Metrics()
    caplog.set_level(logging.INFO, logger=LOGGER)
    real = port.choose(False, engine=engine, tenant="default", metrics=metrics)
    applied = await real.apply(plan, redis=redis, by="operator:0123abcd")
    moved = [ids[2], ids[4], ids[5]]
    assert applied.moved == moved and applied.dead_lettered == ids[:2]
    said = lines(caplog)
    reclaimed = [line for line in said if "entryId" in line and "by" in line]
    assert [line["entryId"] for line in reclaimed] == moved
    assert {line["reason"] for line in reclaimed} == {"manual"}
    assert {line["by"] for line in reclaimed} == {"operator:0123abcd"}
    assert not [line for line in said if "Left" in str(line["message"])]  # the console says it
    async with engine.connect() as conn:
        [row] = (await conn.execute(select(events).where(events.c.kind == "RECLAIMED"))).all()
    assert row.entry_ids == moved and row.detail["by"] == "operator:0123abcd"
    assert row.detail["reason"] == "manual" and "reasons" not in row.detail
    labels = _moved_labels("manual")
    assert metrics.registry.get_sample_value("rig_reclaimed_entries_total", labels) == 3
