"""Blind spells against a real PostgreSQL and Redis: the listening marks, the spell that ends
when a conductor hears again, and a scan that does not count the spell as the agents' silence."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.adapters.postgres.heartbeat_writer import HeartbeatWriter
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, Span
from rig_conductor.reaper import cycle, schedule
from rig_conductor.settings import Settings

from .helpers import fill, owners, port, read, register, wait_for

S, G = "rig:dispatch", "workers"


async def listening_rows(engine: AsyncEngine) -> list[tuple[str, float]]:
    """(replica, seconds its stretch has lasted), oldest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT replica, extract(epoch FROM heard_to - heard_from) FROM listening "
                "ORDER BY heard_from"
            )
        )
        return [(replica, float(length)) for replica, length in rows]


async def test_a_running_writer_keeps_one_stretch_going(
    database_url: str, engine: AsyncEngine
) -> None:
    writer = HeartbeatWriter(database_url, tenant="default", replica="r1", slack_ms=400)
    writer.start()
    try:
        await wait_for(lambda: _lasted(engine, 0.5), within=20)
    finally:
        await writer.stop()
    rows = await listening_rows(engine)
    assert [replica for replica, _ in rows] == ["r1"]


async def _lasted(engine: AsyncEngine, seconds: float) -> bool:
    rows = await listening_rows(engine)
    return bool(rows) and rows[-1][1] >= seconds


async def test_the_first_mark_after_a_silence_ends_the_spell_and_says_so(
    database_url: str, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    # Every replica stopped 30 s ago.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO listening (tenant, replica, heard_from, heard_to) "
                "VALUES ('default', 'r0', now() - interval '1 hour', now() - interval '30 s')"
            )
        )
    ended: list[Span] = []
    writer = HeartbeatWriter(
        database_url, tenant="default", replica="r1", slack_ms=400, on_spell_end=ended.append
    )
    caplog.set_level(logging.WARNING, "rig_conductor")
    writer.start()
    try:
        await wait_for(lambda: bool(ended), within=20)
        await wait_for(lambda: _lasted(engine, 0.5), within=20)
    finally:
        await writer.stop()
    assert len(ended) == 1, "one spell, ended once"
    assert 29 <= (ended[0].end - ended[0].start).total_seconds() < 60
    lines = [r.getMessage() for r in caplog.records if "Blind spell over" in r.getMessage()]
    assert len(lines) == 1 and "does not count toward RIG_AGENT_DOWN_MS" in lines[0]


async def test_failing_heartbeat_writes_are_no_listening(database_url: str) -> None:
    """A batch that fails skips the next mark: the replica could not store heartbeats."""
    writer = HeartbeatWriter(
        database_url + "_no_such_database", tenant="default", replica="r1", slack_ms=400
    )
    writer.start()
    try:
        with pytest.raises(Exception, match="no_such_database"):
            await writer.submit(intake.HeartbeatIn(AgentId("a")))
    finally:
        await writer.stop()


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S,), agent_ids=("review-e",), entry_stale_ms=0, agent_down_ms=20_000
    )


async def test_a_scan_after_an_outage_does_not_take_live_agents_work(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    """The agent's last heartbeat is 40 s old, past RIG_AGENT_DOWN_MS (20 s), but the conductor
    was deaf for 38 of those seconds: not down. Without the listening record, it would be."""
    await fill(redis, S, G, 3)
    await read(redis, S, G, "review-e-0", 3)
    await register(redis, S, G, "other-0")
    await heartbeats(engine, {"review-e": "40 s", "other": "0 s"})
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO listening (tenant, replica, heard_from, heard_to) VALUES "
                "('default', 'r0', now() - interval '1 hour', now() - interval '39 s'), "
                "('default', 'r1', now() - interval '1 s', now())"
            )
        )
    settings = settings.model_copy(update={"agent_ids": ("review-e", "other")})
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=False)
    )
    assert report.reclaimed == 0
    assert report.blind_ms > 30_000
    assert set((await owners(redis, S, G)).values()) == {"review-e-0"}

    # The same silence, heard: the agent is down and its entries move.
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM listening"))
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=False)
    )
    assert report.reclaimed == 3 and report.blind_ms == 0
    assert set((await owners(redis, S, G)).values()) == {"other-0"}


async def test_a_move_is_recorded_and_its_idle_time_is_no_evidence(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    """Entries of a down agent go to a consumer alive by the idle time it earned. The idle time
    that move gave it is no evidence: the next dead consumer's entries may not follow until
    it has read again."""
    settings = settings.model_copy(update={"agent_ids": ("review-e", "other", "third")})
    await fill(redis, S, G, 4)
    await read(redis, S, G, "review-e-0", 2)
    await register(redis, S, G, "other-0")
    await read(redis, S, G, "third-0", 2)
    await heartbeats(engine, {"review-e": "1 hour", "other": "0 s", "third": "0 s"})
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=False)
    )
    assert report.reclaimed == 2
    async with engine.connect() as conn:
        recorded = (await conn.execute(text("SELECT consumer FROM move_targets"))).all()
    assert recorded == [("other-0",)]

    await heartbeats(engine, {"third": "1 hour"})
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=False)
    )
    assert report.reclaimed == 0 and report.no_target == 2

    # `other-0` reads its own pending entries: an idle time of its own again.
    await redis.xreadgroup(G, "other-0", {S: "0"})
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=False)
    )
    assert report.reclaimed == 2
    assert set((await owners(redis, S, G)).values()) == {"other-0"}


async def heartbeats(engine: AsyncEngine, ages: dict[str, str]) -> None:
    """Set each agent's last heartbeat this long ago (an interval: '1 hour', '0 s')."""
    async with engine.begin() as conn:
        for agent, age in ages.items():
            await conn.execute(
                text(
                    "INSERT INTO agent_heartbeats (tenant, agent_id, last_heartbeat_at, degraded) "
                    "VALUES ('default', :agent, now() - CAST(:age AS interval), false) "
                    "ON CONFLICT (tenant, agent_id) DO UPDATE "
                    "SET last_heartbeat_at = EXCLUDED.last_heartbeat_at"
                ),
                {"agent": agent, "age": age},
            )


async def test_a_stopping_conductor_is_deaf_while_it_drains_its_scan(
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once shutdown begins the server takes no request, so the replica's listening marks stop
    then, not after the scan it waits for (seconds, under load): that wait is a blind spell."""
    tenant = f"stopping-{uuid.uuid4().hex[:8]}"
    settings = make_settings(tenant=tenant, streams=(S,), agent_down_ms=3_000, startup_delay_s=3600)
    draining: list[float] = []
    stop = schedule.ReaperService.stop

    async def slow_stop(self: schedule.ReaperService) -> None:
        draining.append(time.time())
        await asyncio.sleep(2)  # a scan still running
        await stop(self)

    monkeypatch.setattr(schedule.ReaperService, "stop", slow_stop)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        await wait_for(lambda: _listened(engine, tenant), within=20)
    async with engine.connect() as conn:
        last = await conn.scalar(
            text("SELECT extract(epoch FROM max(heard_to)) FROM listening WHERE tenant = :t"),
            {"t": tenant},
        )
    assert draining and float(last) < draining[0] + 0.2  # not marked during the 2 s drain


async def _listened(engine: AsyncEngine, tenant: str) -> bool:
    async with engine.connect() as conn:
        found = await conn.scalar(
            text("SELECT count(*) FROM listening WHERE tenant = :t"), {"t": tenant}
        )
    return bool(found)
