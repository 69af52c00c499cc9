"""A dry scan through the dry write port: with something for every effect to do (entries to
move, a worn one to dead-letter, a lost dispatch to append again, a consumer to remove, a silent
agent to forget), Redis and PostgreSQL are left exactly as they were, and the would-lines say
what a real scan does. The same scene scanned for real then changes each of them: the scene
had something to change, and only the port kept it from changing."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches as dispatch_rows
from rig_conductor.adapters.postgres import intake
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import AgentId, ConsumerName, Pods, PodState, StreamKey
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings

from .helpers import fill, idle_at_least, port, read, register

S, G = StreamKey("rig:dispatch"), "workers"
DOWN_MS = 1_500  # the empty consumer must sit idle this long to be removable
DEAD, LIVE, EMPTY = "dead-e-0", "live-e-0", "gone-e-0"
# What a scan saw is recorded by a dry run too: not a change.
SEEN = ("group_measurements", "fleet_measurements")


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S,),
        dispatch_stream=S,
        agent_ids=("dead-e", "live-e"),
        agent_down_ms=DOWN_MS,
        agent_forget_ms=60_000,
        entry_stale_ms=0,
        max_deliveries=3,
    )


async def scene(redis: Redis, engine: AsyncEngine) -> None:
    """dead-e holds four entries, one worn out; live-e heartbeats; gone-e-0's pod is gone and it
    holds nothing; old-e was last heard from two minutes ago; one dispatch Redis lost."""
    fields = {"type": "ISSUE_ASSIGNED", "issueId": "rc-lost", "agentId": "dead-e"}
    lost, _ = await redis_writes.append_once(
        redis, stream=S, key="rc-lost", fields=fields, remember_s=3600
    )
    await dispatch_rows.record_dispatch(
        engine, tenant="default", key="rc-lost", issue_id="rc-lost", agent_id="dead-e",
        stream=S, entry_id=lost, fields=fields,
    )  # fmt: skip
    await redis.xdel(S, lost)
    await redis.delete(redis_keys.dispatched_key(S, "rc-lost"))
    ids = await fill(redis, S, G, 4)
    await register(redis, S, G, EMPTY)
    await read(redis, S, G, DEAD, 4)
    for _ in range(2):  # XCLAIM without JUSTID counts a delivery: three in all
        await redis.xclaim(S, G, DEAD, 0, [ids[0]])
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("old-e"), ConsumerName("old-e-0"))],
    )
    async with engine.begin() as conn:
        for table in ("agent_heartbeats", "consumer_heartbeats"):
            await conn.execute(
                text(
                    f"UPDATE {table} SET last_heartbeat_at = now() - interval '2 minutes' "
                    "WHERE agent_id = 'old-e'"
                )
            )
    await idle_at_least(redis, S, G, DOWN_MS)
    await register(redis, S, G, LIVE)
    await beat_live(engine)


async def beat_live(engine: AsyncEngine) -> None:
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("live-e"), ConsumerName(LIVE))],
    )


async def redis_dump(redis: Redis) -> dict[str, object]:
    """Every key, serialized whole (DUMP: entries, groups, pending lists, consumers)."""
    keys = sorted([key async for key in redis.scan_iter()])
    return {key: (await redis.dump(key), await redis.pttl(key) > 0) for key in keys}


async def postgres_dump(engine: AsyncEngine) -> dict[str, list[str]]:
    """Every row of every table but the measurements, as text."""
    async with engine.connect() as conn:
        tables = (
            await conn.execute(
                text(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                    "AND tablename <> 'alembic_version'"
                )
            )
        ).scalars()
        dump: dict[str, list[str]] = {}
        for table in sorted(set(tables) - set(SEEN)):
            rows = await conn.execute(text(f"SELECT t::text FROM {table} t"))
            dump[table] = sorted(rows.scalars())
    return dump


async def scan(
    redis: Redis, engine: AsyncEngine, settings: Settings, *, dry: bool
) -> cycle.ScanReport:
    # Consumer hygiene asked for as a real scan asks for it, to see what the dry port does.
    return await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        effects=port(engine, settings, dry=dry),
        pods=Pods({ConsumerName(EMPTY): PodState.GONE}),
        hygiene=True,
    )


async def test_a_dry_scan_changes_nothing_and_says_what_it_would(
    redis: Redis, engine: AsyncEngine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    await scene(redis, engine)
    in_redis, in_postgres = await redis_dump(redis), await postgres_dump(engine)
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        report = await scan(redis, engine, settings, dry=True)
    assert await redis_dump(redis) == in_redis
    assert await postgres_dump(engine) == in_postgres
    assert report.dry_run
    assert (report.reclaimed, report.dead_lettered, report.redispatched) == (3, 1, 1)
    said = caplog.text
    assert "[StreamReclaim] DRY RUN: would reclaim" in said
    assert "[StreamReclaim] DRY RUN: would dead-letter" in said
    assert "DRY RUN: would append dispatch rc-lost again" in said
    assert f"[ConsumerHygiene] DRY RUN: would delete consumer {EMPTY} of {S}/{G}" in said
    assert "Registry: forgot" not in said  # a dry run forgets nothing, and says nothing of it

    # The same scene scanned for real changes what the dry scan left alone.
    await beat_live(engine)  # still a target, however long the dry scan took
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        real = await scan(redis, engine, settings, dry=False)
    assert (real.reclaimed, real.dead_lettered, real.redispatched) == (3, 1, 1)
    after = await postgres_dump(engine)
    assert after != in_postgres and await redis_dump(redis) != in_redis
    assert not any("old-e" in row for row in after["agent_heartbeats"])
    assert EMPTY not in {c["name"] for c in await redis.xinfo_consumers(S, G)}
    assert await redis.xlen(redis_streams.dlq_key(S, redis)) == 1
