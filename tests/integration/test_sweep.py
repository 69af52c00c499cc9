"""The server-side sweep applies exactly the policy's entry rule (`plan_reclaims` is its
reference), on random pending lists, on every Redis version at hand."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from rig_conductor.adapters import redis_streams
from rig_conductor.domain import (
    AgentId,
    EntryId,
    Evidence,
    GroupName,
    Heartbeat,
    Limits,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet

from .helpers import fill, owners, read, register

S, G = StreamKey("rig:dispatch"), GroupName("workers")


async def test_sweep_matches_the_reference_rule(any_redis: Redis) -> None:
    rng = random.Random(20261121)
    for round_ in range(6):
        await any_redis.flushdb()
        ids = await fill(any_redis, S, G, 120)
        await register(any_redis, S, G, "live-0")
        owners_ = ["dead-0", "dead-1", "live-1"]
        for owner in owners_:
            await read(any_redis, S, G, owner, 30)
        # Some entries are delivered again (deliveries 2..4), some were just re-read (fresh).
        for entry_id in rng.sample(ids[:90], 25):
            holder = (await owners(any_redis, S, G))[entry_id]
            for _ in range(rng.randint(1, 3)):
                await any_redis.xclaim(S, G, holder, min_idle_time=0, message_ids=[entry_id])
        await asyncio.sleep(0.12)
        for entry_id in rng.sample(ids[:90], 10):
            holder = (await owners(any_redis, S, G))[entry_id]
            await any_redis.xclaim(
                S, G, holder, min_idle_time=0, message_ids=[entry_id], justid=True
            )
        limits = Limits(entry_stale_ms=100, agent_down_ms=60_000, max_deliveries=3)
        now = datetime.now(UTC)
        evidence = Evidence(
            now=now,
            known_agents=frozenset({AgentId("dead"), AgentId("live")}),
            agent_heartbeats={AgentId("live"): Heartbeat(now - timedelta(seconds=1))},
        )
        group = next(
            g for g in await redis_streams.describe_groups(any_redis, streams=[S]) if g.name == G
        )
        assessment = reclaim.assess_group(group, Fleet(evidence, limits))
        assert set(assessment.down) == {"dead-0", "dead-1"}
        attempts = {EntryId(i): 3 for i in rng.sample(ids[:60], 5)}
        entries = await redis_streams.pending_entries(
            any_redis,
            stream=S,
            group=G,
            min_idle_ms={c: assessment.min_idle_ms(c, limits) for c in assessment.down},
        )
        expected = reclaim.plan_reclaims(assessment, entries, limits, attempts)
        rules = reclaim.entry_rules(assessment, limits, attempts)
        target = assessment.target
        assert target is not None
        swept = await redis_streams.sweep(
            any_redis,
            stream=S,
            group=G,
            target=target.consumer,
            page_size=7,
            rules=[
                redis_streams.SweepRule(r.owner, r.min_idle_ms, r.max_deliveries, tuple(r.worn))
                for r in rules
            ],
        )
        moved = sorted(i for s in swept.values() for i in s.moved)
        worn = sorted(e.id for s in swept.values() for e in s.worn)
        assert moved == sorted(e.id for e in expected.moves), f"round {round_}"
        assert worn == sorted(e.id for e in expected.dead_letters), f"round {round_}"
        holders = await owners(any_redis, S, G)
        assert all(holders[i] == target.consumer for i in moved)
        assert all(holders[i] in {"dead-0", "dead-1"} for i in worn)  # left for the DLQ path
