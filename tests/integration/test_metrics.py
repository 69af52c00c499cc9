"""/metrics: every contract family from start-up, values after real scans, promtool clean."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import __version__
from rig_conductor import build as build_module
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .helpers import fill, read, register

FAMILIES = {
    "rig_reclaimed_entries": "counter",
    "rig_dead_lettered_entries": "counter",
    "rig_reclaim_no_target": "counter",
    "rig_reaper_scans": "counter",
    "rig_reaper_scan_duration_seconds": "histogram",
    "rig_pending_entries": "gauge",
    "rig_pending_oldest_idle_seconds": "gauge",
    "rig_agent_heartbeat_age_seconds": "gauge",
    "rig_agent_up": "gauge",
    "rig_stream_consumers_without_heartbeat": "gauge",
    "rig_heartbeats_received": "counter",
    "rig_dispatched_entries": "counter",
    "rig_build_info": "gauge",
    "rig_work_finished": "counter",
    "rig_work_duration_seconds": "histogram",
    "rig_stream_group_lag": "gauge",
    "rig_reclaim_delay_seconds": "histogram",
}


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        streams=("rig:dispatch",),
        agent_ids=("dev-e", "qa-e"),
        entry_stale_ms=0,
        api_tokens="secret-0123456789",
    )
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://c",
            headers={"Authorization": "Bearer secret-0123456789"},
        ) as c:
            yield c


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_every_family_is_exposed_from_start_up(client: httpx.AsyncClient) -> None:
    answer = await client.get("/metrics", headers={"Authorization": ""})  # no token needed
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    declared = {f.name: f.type for f in text_string_to_metric_families(answer.text)}
    assert {name: declared.get(name) for name in FAMILIES} == FAMILIES
    for name in FAMILIES:
        assert f"# HELP {name}" in answer.text or f"# HELP {name}_total" in answer.text
    build = {
        labels: value
        for (name, labels), value in samples(answer.text).items()
        if name == "rig_build_info"
    }
    assert build == {(("revision", build_module.revision()), ("version", __version__)): 1.0}


async def test_scans_move_the_numbers(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    await client.post(
        "/api/events", json={"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev-e"}
    )
    await fill(redis, "rig:dispatch", "workers", 3, start=2)
    await read(redis, "rig:dispatch", "workers", "dev-e-rig-agent-runtime-0", 4)
    await register(redis, "rig:dispatch", "workers", "qa-e-0")
    await client.post(
        "/api/events", json={"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"}
    )
    before = samples((await client.get("/metrics")).text)
    assert before[("rig_dispatched_entries_total", (("stream", "rig:dispatch"),))] == 1
    assert before[("rig_heartbeats_received_total", ())] == 1
    assert before[("rig_agent_up", (("agent", "qa-e"),))] == 1

    dry = (await client.post("/api/reaper/scan?dryRun=true")).json()
    assert dry["reclaimed"] == 4 and dry["consumersWithoutHeartbeat"] == 1
    mid = samples((await client.get("/metrics")).text)
    assert (
        "rig_reclaimed_entries_total",
        (
            ("from_agent", "dev-e"),
            ("group", "workers"),
            ("reason", "down"),
            ("stream", "rig:dispatch"),
            ("to_agent", "qa-e"),
        ),
    ) not in mid  # a dry run moves nothing
    assert (
        mid[
            (
                "rig_stream_consumers_without_heartbeat",
                (("group", "workers"), ("stream", "rig:dispatch")),
            )
        ]
        == 1
    )
    assert (
        mid[
            (
                "rig_pending_entries",
                (("agent", "dev-e"), ("group", "workers"), ("stream", "rig:dispatch")),
            )
        ]
        == 4
    )
    assert mid[("rig_agent_up", (("agent", "dev-e"),))] == 0

    real = (await client.post("/api/reaper/scan")).json()
    assert real["reclaimed"] == 4
    after = samples((await client.get("/metrics")).text)
    key = (
        "rig_reclaimed_entries_total",
        (
            ("from_agent", "dev-e"),
            ("group", "workers"),
            ("reason", "down"),
            ("stream", "rig:dispatch"),
            ("to_agent", "qa-e"),
        ),
    )
    assert after[key] == 4
    assert after[("rig_reaper_scans_total", (("outcome", "ok"),))] == 2
    assert after[("rig_reaper_scans_total", (("outcome", "error"),))] == 0
    assert after[("rig_reaper_scan_duration_seconds_count", ())] == 2
    # The entries now belong to qa-e: its agent's gauge carries them, dev-e's is gone.
    assert (
        after[
            (
                "rig_pending_entries",
                (("agent", "qa-e"), ("group", "workers"), ("stream", "rig:dispatch")),
            )
        ]
        == 4
    )
    assert (
        "rig_pending_entries",
        (("agent", "dev-e"), ("group", "workers"), ("stream", "rig:dispatch")),
    ) not in after
    assert (
        after[
            (
                "rig_stream_consumers_without_heartbeat",
                (("group", "workers"), ("stream", "rig:dispatch")),
            )
        ]
        == 0
    )
    assert (
        after[
            ("rig_pending_oldest_idle_seconds", (("group", "workers"), ("stream", "rig:dispatch")))
        ]
        >= 0
    )


async def test_detector_announces_each_sighting_once(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(redis, "rig:dispatch", "workers", 2)
    await read(redis, "rig:dispatch", "workers", "mystery-pod-7", 2)  # no known agent: no reclaim
    for _ in range(3):
        report = (await client.post("/api/reaper/scan")).json()
        assert (report["consumersWithoutHeartbeat"], report["reclaimed"]) == (1, 0)
    lines = [r.getMessage() for r in caplog.records if "[StreamDetector]" in r.getMessage()]
    assert lines == [
        "[StreamDetector] Consumer mystery-pod-7 holds 2 pending entries on rig:dispatch/workers "
        "with no fresh heartbeat (agent unknown)"
    ]
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(events).where(events.c.kind == "CONSUMER_WITHOUT_HEARTBEAT"))
        ).all()
    assert [(r.consumer, r.stream, r.group_name, r.detail) for r in rows] == [
        ("mystery-pod-7", "rig:dispatch", "workers", {"pending": 2})
    ]


async def test_failed_scans_are_counted(
    make_settings: Callable[..., Settings], engine: AsyncEngine
) -> None:
    app = create_app(make_settings(redis_url="redis://127.0.0.1:1/0"), schedule_reaper=False)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://c") as c,
    ):
        assert (await c.post("/api/reaper/scan")).status_code == 503
        text = (await c.get("/metrics")).text
    assert samples(text)[("rig_reaper_scans_total", (("outcome", "error"),))] == 1


async def test_promtool_finds_nothing_to_report(client: httpx.AsyncClient, redis: Redis) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing in CI: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (Debian package `prometheus`)")
    await fill(redis, "rig:dispatch", "workers", 2)
    await read(redis, "rig:dispatch", "workers", "dev-e-0", 2)
    await client.post(
        "/api/events", json={"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"}
    )
    await client.post("/api/reaper/scan")
    exposition: Any = (await client.get("/metrics")).text
    checked = await asyncio.to_thread(
        subprocess.run,
        [promtool, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0 and checked.stdout == "" and checked.stderr == "", (
        checked.stdout + checked.stderr
    )
