"""Work metrics on real servers: attempts finished by outcome and how long they took, each
group's lag (Redis 7's own figure, and counted where Redis does not say), how long moved
entries had sat idle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.redis import lag as redis_lag
from rig_conductor.domain import StreamKey
from rig_conductor.settings import Settings

from .console_kit import AGENT, OPERATOR, G, S, builder, client_of, heartbeat
from .helpers import fill, read, register
from .test_metrics import samples

AS_AGENT = {"Authorization": f"Bearer {AGENT}"}
LABELS = (("group", G), ("stream", S))


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = builder(make_settings)()
    async for c in client_of(app):
        yield c


async def report(client: httpx.AsyncClient, kind: str, entry: str, **extra: Any) -> int:
    body = {
        "type": kind,
        "agentId": "dev-e",
        "consumer": "dev-e-0",
        "stream": S,
        "group": G,
        "entryId": entry,
        **extra,
    }
    answer = await client.post("/api/events", json=body, headers=AS_AGENT)
    return answer.status_code


async def metrics(
    client: httpx.AsyncClient,
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return samples((await client.get("/metrics")).text)


async def test_finished_attempts_are_counted_by_outcome_and_timed(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    ids = await fill(redis, S, G, 4)
    await read(redis, S, G, "dev-e-0", 4)
    for entry in ids:
        assert await report(client, "WORK_STARTED", entry) == 202
    assert await report(client, "WORK_COMPLETED", ids[0], attempt=1) == 202
    assert await report(client, "WORK_FAILED", ids[1], attempt=1, error="boom") == 202
    abandoned = "abandoned: no progress within 5s"
    assert await report(client, "WORK_FAILED", ids[2], attempt=1, error=abandoned) == 202
    assert await report(client, "WORK_STARTED", ids[3]) == 202  # attempt 2: 1 is fenced
    assert await report(client, "WORK_COMPLETED", ids[3], attempt=1) == 409

    found = await metrics(client)
    for outcome in ("completed", "failed", "abandoned", "fenced"):
        key = ("rig_work_finished_total", (*LABELS[:1], ("outcome", outcome), *LABELS[1:]))
        assert found[key] == 1, (outcome, found.get(key))
    assert found[("rig_work_duration_seconds_count", LABELS)] == 1
    assert found[("rig_work_duration_seconds_sum", LABELS)] >= 0


async def test_the_lag_of_each_group_after_a_scan(client: httpx.AsyncClient, redis: Redis) -> None:
    await fill(redis, S, G, 5)
    await read(redis, S, G, "qa-e-0", 2)
    await redis.xgroup_create(S, "audit", id="0")
    await client.post("/api/reaper/scan?dryRun=true", headers=AS_AGENT)
    found = await metrics(client)
    assert found[("rig_stream_group_lag", LABELS)] == 3
    assert found[("rig_stream_group_lag", (("group", "audit"), ("stream", S)))] == 5


async def test_the_lag_is_counted_where_redis_does_not_say(redis: Redis) -> None:
    """Redis 6.2 has no `lag` in XINFO GROUPS: the entries after the last-delivered id are
    counted inside Redis."""
    ids = await fill(redis, S, G, 7)
    infos = [
        (StreamKey(S), {"last-delivered-id": ids[2]}),
        (StreamKey(S), {"last-delivered-id": "0-0"}),
        (StreamKey(S), {"last-delivered-id": ids[-1]}),
        (StreamKey(S), {"lag": 11, "last-delivered-id": "0-0"}),
        (StreamKey("nowhere"), {"last-delivered-id": "0-0"}),
    ]
    assert await redis_lag.group_lags(redis, infos) == [4, 7, 0, 11, 0]


async def test_a_reclaim_records_how_long_each_entry_sat_idle(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    await fill(redis, S, G, 3)
    await read(redis, S, G, "dev-e-0", 3)  # dev-e never heartbeats: down
    await register(redis, S, G, "qa-e-0")
    await heartbeat(client, "qa-e", "qa-e-0")
    dry = await client.post("/api/reaper/scan?dryRun=true", headers=AS_AGENT)
    assert dry.json()["reclaimed"] == 3
    key = ("rig_reclaim_delay_seconds_count", (*LABELS[:1], ("reason", "down"), *LABELS[1:]))
    assert key not in await metrics(client)  # a dry run moves nothing
    scan = await client.post(
        "/api/reaper/scan?dryRun=false", headers={"Authorization": f"Bearer {OPERATOR}"}
    )
    assert scan.json()["reclaimed"] == 3, scan.text
    found = await metrics(client)
    assert found[key] == 3
    assert found[(key[0].replace("_count", "_sum"), key[1])] >= 0
