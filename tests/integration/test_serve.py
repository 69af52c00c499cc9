"""`rig-conductor serve` as a process, the reaper's schedule, and event retention."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import cycle, leader
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.scan_report import ScanReport
from rig_conductor.settings import Settings
from tests import redis_kit

from .helpers import fill, owners, read, register, serve, wait_for


async def test_serve_reclaims_on_schedule_and_stops_on_sigterm(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str
) -> None:
    ids = await fill(redis, "rig:dispatch", "workers", 3)
    await read(redis, "rig:dispatch", "workers", "dev-e-rig-agent-runtime-0", 3)
    await register(redis, "rig:dispatch", "workers", "qa-e-0")
    async with serve(
        redis_url,
        database_url,
        RIG_STREAMS="rig:dispatch",
        RIG_AGENT_IDS="dev-e,qa-e",
        RIG_ENTRY_STALE_MS="0",
        RIG_SCAN_INTERVAL_S="0.3",
        RIG_STARTUP_DELAY_S="0",
        RIG_LOG_FORMAT="json",
    ) as conductor:
        async with httpx.AsyncClient(base_url=conductor.url) as client:
            answer = await client.post(
                "/api/events", json={"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"}
            )
            assert answer.status_code == 202

        async def moved() -> bool:
            return await owners(redis, "rig:dispatch", "workers") == dict.fromkeys(ids, "qa-e-0")

        await wait_for(moved)
    assert conductor.process.returncode == 0, conductor.stderr[-2000:]
    assert conductor.stdout == ""
    assert '"message": "[StreamReclaim] Reclaimed' in conductor.stderr
    assert "Shut down cleanly" in conductor.stderr
    assert "RIG_ALLOW_ANONYMOUS: no token of any role is set" in conductor.stderr
    assert "RIG_SESSION_SECRET is empty" in conductor.stderr
    assert "effective configuration" in conductor.stderr


async def test_failing_scans_do_not_stop_the_schedule(
    engine: AsyncEngine, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    dead = redis_kit.connect("redis://127.0.0.1:1/0")
    settings = make_settings(scan_interval_s=0.1, startup_delay_s=0)
    service = ReaperService(redis=dead, engine=engine, settings=settings)
    service.start()
    try:
        # Each scan retries the refused connection with backoff (a few seconds) before failing.
        await wait_for(lambda: service.failed_scans >= 3, within=40)
    finally:
        await service.stop()
        await dead.aclose()
    assert "Scan failed: Redis unavailable" in caplog.text


async def test_a_replica_whose_election_fails_counts_failed_scans(
    engine: AsyncEngine,
    redis: Redis,
    make_settings: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """PostgreSQL (or the Kubernetes API) down: the replica cannot tell who reaps, so its
    scheduled scans fail and say so, instead of being skipped as a follower's are."""
    settings = make_settings(scan_interval_s=0.1, startup_delay_s=0)
    elector = leader.LeaseRowElector(
        database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
        tenant="default",
        lease_duration_s=1.5,
    )
    metrics = Metrics()
    service = ReaperService(
        redis=redis, engine=engine, settings=settings, metrics=metrics, elector=elector
    )
    await elector.start()
    service.start()
    try:
        await wait_for(lambda: service.failed_scans >= 3, within=10)
    finally:
        await service.stop()
        await elector.stop()
    assert service.last_report is None
    assert metrics.registry.get_sample_value("rig_reaper_scans_total", {"outcome": "error"}) >= 3
    assert "Scan failed: no active reaper can be elected: PostgreSQL unavailable" in caplog.text


async def test_startup_delay_holds_the_first_scan(
    engine: AsyncEngine, redis: Redis, make_settings: Callable[..., Settings]
) -> None:
    held = make_settings(scan_interval_s=0.1, startup_delay_s=30)
    service = ReaperService(redis=redis, engine=engine, settings=held)
    service.start()
    await asyncio.sleep(0.5)  # five scan intervals, all inside the delay: none may scan
    await service.stop()
    assert service.last_report is None
    prompt = make_settings(scan_interval_s=0.1, startup_delay_s=0)
    service = ReaperService(redis=redis, engine=engine, settings=prompt)
    service.start()
    await wait_for(lambda: service.last_report is not None, within=5)
    await service.stop()


async def test_stop_waits_for_the_scan_in_progress(
    engine: AsyncEngine, redis: Redis, make_settings: Callable[..., Settings]
) -> None:
    service = ReaperService(redis=redis, engine=engine, settings=make_settings())
    scan = asyncio.create_task(service.scan())
    await asyncio.sleep(0)  # one turn of the loop: the scan has begun
    await service.stop()
    assert scan.done() and service.last_report is not None


async def test_stop_lets_a_scheduled_scan_finish(
    engine: AsyncEngine,
    redis: Redis,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The scheduler's shutdown cancels the jobs it runs; a scan it started must still finish,
    with nothing logged as failed."""
    started = asyncio.Event()
    real = cycle.reap_once

    async def slow_scan(**kwargs: Any) -> ScanReport:
        started.set()
        await asyncio.sleep(0.3)  # still scanning when stop() is called
        return await real(**kwargs)

    monkeypatch.setattr(cycle, "reap_once", slow_scan)
    service = ReaperService(
        redis=redis, engine=engine, settings=make_settings(scan_interval_s=60, startup_delay_s=0)
    )
    service.start()
    await asyncio.wait_for(started.wait(), timeout=10)
    await service.stop()
    assert service.last_report is not None
    assert service.failed_scans == 0
    assert "raised an exception" not in caplog.text
    assert "CancelledError" not in caplog.text


async def test_no_scan_starts_once_stop_returns(
    engine: AsyncEngine,
    redis: Redis,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """APScheduler shuts down a loop turn after it is told to, and its timer may start a job
    in between. No scan may start once stop() has returned: it would run on, unwaited, and
    hold a connection inside a transaction."""
    late: list[int] = []
    stopped = False
    real = cycle.reap_once

    async def watched(**kwargs: Any) -> ScanReport:
        if stopped:
            late.append(turns)
        return await real(**kwargs)

    monkeypatch.setattr(cycle, "reap_once", watched)
    settings = make_settings(scan_interval_s=60, startup_delay_s=0)
    for turns in range(4):  # stop() called this many loop turns after start()
        stopped = False
        service = ReaperService(redis=redis, engine=engine, settings=settings)
        service.start()
        for _ in range(turns):
            await asyncio.sleep(0)  # one turn of the loop
        await service.stop()
        stopped = True
        await asyncio.sleep(0.1)  # time for a timer left behind to start a scan
    assert late == [], f"scans started after stop() returned, stopped after {late} loop turns"


async def test_retention_deletes_old_events_in_batches(engine: AsyncEngine) -> None:
    reports = [queries.EventRow("WORK_PROGRESS", agent_id="dev-e")] * 25
    await pg_writes.append_events(engine, tenant="default", rows=reports)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE events SET occurred_at = now() - interval '40 days' WHERE id <= 23")
        )
    deleted = await queries.delete_old_events(engine, older_than_days=30, batch=5)
    assert deleted == 23
    assert await queries.count_events(engine, tenant="default", kind="WORK_PROGRESS") == 2
