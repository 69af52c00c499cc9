"""Scans asked for through `POST /api/reaper/scan` coalesce: requests that arrive together share
one scan and its report, scans of one kind never run side by side, and a flood of dry runs never
holds back the scans that reclaim. Real Redis and PostgreSQL; the scans counted by their rows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import scan_reports
from rig_conductor.app import create_app
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.settings import Settings

from .helpers import fill, read, register, wait_for

S, G = "rig:dispatch", "workers"
OPERATOR, VIEWER = "op-secret-0123456789", "view-secret-012345678"


@pytest.fixture
async def api(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        streams=(S,), dispatch_stream=S, operator_tokens=OPERATOR, viewer_tokens=VIEWER
    )
    await fill(redis, S, G, 3)
    await read(redis, S, G, "dev-e-0", 3)
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


async def scans_run(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(scan_reports))).scalar())


async def ask(api: httpx.AsyncClient, token: str, **params: Any) -> dict[str, Any]:
    answer = await api.post(
        "/api/reaper/scan", params=params, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    report: dict[str, Any] = answer.json()
    return report


@pytest.mark.parametrize(("token", "dry_run"), [(VIEWER, "true"), (OPERATOR, "false")])
async def test_concurrent_requests_share_scans(
    api: httpx.AsyncClient, engine: AsyncEngine, token: str, dry_run: str
) -> None:
    reports = await asyncio.gather(*(ask(api, token, dryRun=dry_run) for _ in range(20)))
    # The first request's scan, then at most one more for all that came while it ran.
    assert 1 <= await scans_run(engine) <= 2
    assert len({r["durationMs"] for r in reports}) <= 2
    assert all(r["dryRun"] is (dry_run == "true") and r["pending"] == 3 for r in reports)
    # A request after them gets a scan of its own.
    await ask(api, token, dryRun=dry_run)
    assert await scans_run(engine) <= 3


async def test_a_dry_run_in_progress_does_not_hold_back_a_scan_that_reclaims(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    await fill(redis, S, G, 2)
    await read(redis, S, G, "dev-e-0", 2)  # dev-e never heartbeats: down
    await register(redis, S, G, "qa-e-0")  # a live target by its own reading
    settings = make_settings(streams=(S,), agent_ids=("dev-e",), entry_stale_ms=0)
    service = ReaperService(redis=redis, engine=engine, settings=settings)
    async with engine.connect() as blocker:
        # The dry run's report cannot be stored until the blocker lets go: it stays in
        # progress, as a slow scan would.
        await blocker.execute(text("LOCK TABLE scan_reports IN ACCESS EXCLUSIVE MODE"))
        dry = asyncio.create_task(service.scan_now(True))
        await wait_for(lambda: _waiting_on_scan_reports(engine), explain=lambda: dry)
        more = [asyncio.create_task(service.scan_now(True)) for _ in range(5)]
        report = await asyncio.wait_for(service.scan(remember=False), timeout=60)
        assert not dry.done()
        await blocker.rollback()
    assert report.reclaimed == 2 and not report.dry_run
    assert {c["name"]: c["pending"] for c in await redis.xinfo_consumers(S, G)} == {
        "dev-e-0": 0,
        "qa-e-0": 2,
    }
    shared = await asyncio.gather(*more)
    assert (await dry).dry_run and all(r.dry_run for r in shared)
    assert len({id(r) for r in shared}) == 1  # the five queued together: one scan
    assert await scans_run(engine) == 2  # the blocked dry run, and the one the five shared


async def _waiting_on_scan_reports(engine: AsyncEngine) -> bool:
    query = text(
        "SELECT count(*) FROM pg_locks WHERE relation = 'scan_reports'::regclass AND NOT granted"
    )
    async with engine.connect() as conn:
        return bool((await conn.execute(query)).scalar())
