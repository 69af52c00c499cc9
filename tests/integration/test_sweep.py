"""The scan's group sweep (pages read, planned by the policy a chunk at a time with several chunks
in flight, claimed) ends where the policy's plan of the whole lists at once does, on random
pending lists, on every Redis at hand."""

from __future__ import annotations

import asyncio
import gc
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from rig_conductor.adapters import redis_streams
from rig_conductor.domain import (
    AgentId,
    ConsumerName,
    EntryId,
    Evidence,
    GroupName,
    Heartbeat,
    Limits,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from rig_conductor.reaper import moves

from .helpers import fill, owners, read, register

S, G = StreamKey("rig:dispatch"), GroupName("workers")
STALE_MS = 1_000


@pytest.mark.parametrize("chunk", [moves.CHUNK, 7], ids=["one-chunk", "chunk-per-owner"])
async def test_sweep_matches_the_plan_of_whole_lists(
    any_redis: Redis, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(moves, "CHUNK", chunk)
    rng = random.Random(20261121)
    for round_ in range(6):
        await any_redis.flushdb()
        ids = await fill(any_redis, S, G, 120)
        await register(any_redis, S, G, "live-0")
        owners_ = ["dead-0", "dead-1", "live-1", "sick-0"]
        for owner in owners_:
            await read(any_redis, S, G, owner, 30)
        # Some entries are delivered again (deliveries 2..4), some were just re-read (fresh).
        for entry_id in rng.sample(ids[:90], 25):
            holder = (await owners(any_redis, S, G))[entry_id]
            for _ in range(rng.randint(1, 3)):
                await any_redis.xclaim(S, G, holder, min_idle_time=0, message_ids=[entry_id])
        # Stale past STALE_MS; the re-read below stay fresh for STALE_MS, however slowly the
        # plan and the sweep that follow run on a loaded machine.
        await asyncio.sleep(STALE_MS / 1000 + 0.05)
        for entry_id in rng.sample(ids[:90], 10):
            holder = (await owners(any_redis, S, G))[entry_id]
            await any_redis.xclaim(
                S, G, holder, min_idle_time=0, message_ids=[entry_id], justid=True
            )
        limits = Limits(
            entry_stale_ms=STALE_MS, agent_down_ms=60_000, max_deliveries=3, degraded_grace_ms=1_000
        )
        now = datetime.now(UTC)
        evidence = Evidence(
            now=now,
            known_agents=frozenset({AgentId("dead"), AgentId("live"), AgentId("sick")}),
            agent_heartbeats={
                AgentId("live"): Heartbeat(now - timedelta(seconds=1)),
                AgentId("sick"): Heartbeat(now, True, now - timedelta(seconds=5)),
            },
        )
        group = next(
            g for g in await redis_streams.describe_groups(any_redis, streams=[S]) if g.name == G
        )
        attempts = {EntryId(i): 3 for i in rng.sample(ids[:60], 5)}
        assessment = reclaim.assess_group(group, Fleet(evidence, limits), attempts=attempts)
        assert set(assessment.down) == {"dead-0", "dead-1"}
        assert assessment.rules[ConsumerName("sick-0")].reason == "degraded"
        entries = await redis_streams.pending_entries(
            any_redis,
            stream=S,
            group=G,
            min_idle_ms=dict.fromkeys(assessment.rules, 0),
        )
        expected = reclaim.plan_reclaims(assessment, entries)
        moved: dict[str, str] = {}
        collecting: set[bool] = set()  # whether the cycle collector ran during the moves

        def heard(
            owner: ConsumerName,
            target: ConsumerName,
            ids: list[EntryId],
            moved: dict[str, str] = moved,
            collecting: set[bool] = collecting,
        ) -> None:
            moved.update(dict.fromkeys(ids, target))
            collecting.add(gc.isenabled())

        swept = await moves.sweep_group(
            any_redis, assessment, dry_run=False, page_size=7, on_moved=heard
        )
        assert collecting == {False} and gc.isenabled()  # paused for the sweep only (gcpolicy)
        assert swept.reclaimed == len(moved)
        assert sorted(moved) == sorted(m.entry.id for m in expected.moves), f"round {round_}"
        worn = sorted(e.id for e in swept.worn)
        assert worn == sorted(e.id for e in expected.dead_letters), f"round {round_}"
        # Page by page or all at once, the spread ends at the same loads.
        assert Counter(moved.values()) == Counter(m.to for m in expected.moves), f"round {round_}"
        holders = await owners(any_redis, S, G)
        assert all(holders[i] == target for i, target in moved.items())
        assert set(moved.values()) <= {"live-0", "live-1"}
        assert all(holders[i] in {"dead-0", "dead-1", "sick-0"} for i in worn)  # for the DLQ
