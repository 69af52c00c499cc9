"""The scan's group sweep (pages read, planned by the policy a chunk at a time with several chunks
in flight, claimed by the applier) ends where the policy's plan of the whole lists at once does,
on random pending lists, on every Redis at hand."""

from __future__ import annotations

import contextlib
import gc
import random
from collections import Counter
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events
from rig_conductor.adapters.redis import streams as redis_streams
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
from rig_conductor.effects import applier as effects
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from rig_conductor.reaper import moves
from tests import reclaim_kit, redis_kit

from .helpers import fill, idle_at_least, owners, read, register

S, G = StreamKey("rig:dispatch"), GroupName("workers")
STALE_MS = 1_000


@pytest.mark.parametrize("chunk", [moves.CHUNK, 7], ids=["one-chunk", "chunk-per-owner"])
async def test_sweep_matches_the_plan_of_whole_lists(
    any_redis: Redis, engine: AsyncEngine, chunk: int, monkeypatch: pytest.MonkeyPatch
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
        await idle_at_least(any_redis, S, G, STALE_MS)
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
                AgentId("sick"): Heartbeat(
                    now, True, anonymous=Heartbeat(now, True, now - timedelta(seconds=5))
                ),
            },
        )
        group = next(
            g for g in await redis_streams.describe_groups(any_redis, streams=[S]) if g.name == G
        )
        attempts = {EntryId(i): 3 for i in rng.sample(ids[:60], 5)}
        assessment = reclaim.assess_group(group, Fleet(evidence, limits), attempts=attempts)
        assert set(assessment.down) == {"dead-0", "dead-1"}
        assert assessment.rules[ConsumerName("sick-0")].reason == "degraded"
        entries = await redis_kit.pending_entries(
            any_redis,
            stream=S,
            group=G,
            min_idle_ms=dict.fromkeys(assessment.rules, 0),
        )
        expected = reclaim_kit.plan_reclaims(assessment, entries)
        collecting: set[bool] = set()  # whether the cycle collector ran during the moves

        def timing(phase: str, collecting: set[bool] = collecting) -> AbstractContextManager[None]:
            if phase != "record":  # the rows left are written once the sweep is done
                collecting.add(gc.isenabled())
            return contextlib.nullcontext()

        applier = effects.Applier(
            assessment,
            redis=any_redis,
            journal=effects.Journal(engine, f"sweep-{round_}"),
            metrics=None,
            timing=timing,
        )
        await moves.sweep_group(
            assessment,
            reader=moves.PageReader(any_redis, timing),
            effects=applier,
            page_size=7,
        )
        await applier.flush()
        assert collecting == {False} and gc.isenabled()  # paused for the sweep only (gcpolicy)
        # What moved, as the event log has it.
        moved: dict[str, str] = {}
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(events.c.entry_ids, events.c.detail).where(
                    events.c.kind == "RECLAIMED", events.c.tenant == f"sweep-{round_}"
                )
            )
            for entry_ids, detail in rows:
                moved.update(dict.fromkeys(entry_ids, detail["toConsumer"]))
        assert sum(applier.moved.values()) == len(moved)
        assert sorted(moved) == sorted(m.entry.id for m in expected.moves), f"round {round_}"
        worn = sorted(e.id for e in applier.worn)
        assert worn == sorted(e.id for e in expected.dead_letters), f"round {round_}"
        # Page by page or all at once, the spread ends at the same loads.
        assert Counter(moved.values()) == Counter(m.to for m in expected.moves), f"round {round_}"
        holders = await owners(any_redis, S, G)
        assert all(holders[i] == target for i, target in moved.items())
        assert set(moved.values()) <= {"live-0", "live-1"}
        assert all(holders[i] in {"dead-0", "dead-1", "sick-0"} for i in worn)  # for the DLQ
