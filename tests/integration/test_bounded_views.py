"""Views of bounded size at any fleet size: `GET /api/streams` pages by stream and reads what the
last scan measured (`asOf`); a group's consumers page live
(`GET /api/streams/{stream}/groups/{group}/consumers`); polling viewers never make the conductor
read Redis more often than the reaper does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime

import httpx
from fastapi import FastAPI
from pydantic import TypeAdapter
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.api import schemas
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .console_kit import client_of
from .helpers import fill, read, register

G = "workers"


def _app(make_settings: Callable[..., Settings]) -> FastAPI:
    settings = make_settings(agent_ids=("live", "dead"), streams=("s:*",), agent_down_ms=60_000)
    return create_app(settings, schedule_reaper=False)


async def _scans(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM scan_reports"))).scalar_one())


def _aliases(model: type[schemas.Wire]) -> frozenset[str]:
    return frozenset(field.alias or name for name, field in model.model_fields.items())


async def _beat(api: httpx.AsyncClient, agent: str) -> None:
    answer = await api.post("/api/events", json={"type": "HEARTBEAT", "agentId": agent})
    assert answer.status_code == 202, answer.text


async def test_streams_page_by_stream_and_never_split_a_streams_groups(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    for stream in ("s:a", "s:b", "s:c"):
        for group in ("g1", "g2"):
            await fill(redis, stream, group, 1)
    async for api in client_of(_app(make_settings)):
        first = await api.get("/api/streams", params={"limit": 2})
        assert first.status_code == 200, first.text
        rows = first.json()
        assert [(r["stream"], r["group"]) for r in rows] == [
            ("s:a", "g1"),
            ("s:a", "g2"),
            ("s:b", "g1"),
            ("s:b", "g2"),
        ]
        assert first.headers["link"] == '<?limit=2&after=s%3Ab>; rel="next"'
        rest = await api.get("/api/streams", params={"limit": 2, "after": "s:b"})
        assert [(r["stream"], r["group"]) for r in rest.json()] == [("s:c", "g1"), ("s:c", "g2")]
        assert "link" not in rest.headers
        # Every figure says when the scan measured it.
        assert all(datetime.fromisoformat(r["asOf"]) for r in rows)
        # PostgreSQL builds the body: it holds the schema's fields, each of the schema's type.
        TypeAdapter(list[schemas.GroupView]).validate_json(first.content, strict=True)
        assert {frozenset(r) for r in rows} == {_aliases(schemas.GroupView)}
        assert first.headers["content-type"] == "application/json"
        documented = (await api.get("/openapi.json")).json()["paths"]["/api/streams"]["get"]
        schema = documented["responses"]["200"]["content"]["application/json"]["schema"]
        assert schema["items"] == {"$ref": "#/components/schemas/GroupView"}
        assert (await api.get("/api/streams", params={"limit": 1001})).status_code == 422


async def test_a_group_lists_ten_consumers_holding_most_and_counts_them_all(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    await fill(redis, "s:a", G, 60)
    for n in range(1, 11):  # live-1 holds 1, ... live-10 holds 10
        await read(redis, "s:a", G, f"live-{n}", n)
    for n in range(11, 16):
        await register(redis, "s:a", G, f"live-{n}")
    async for api in client_of(_app(make_settings)):
        await _beat(api, "live")
        [group] = (await api.get("/api/streams")).json()
        assert (group["consumerCount"], group["pending"]) == (15, 55)
        assert [c["name"] for c in group["consumers"]] == [f"live-{n}" for n in range(10, 0, -1)]
        assert {c["agentId"] for c in group["consumers"]} == {"live"}
        assert {frozenset(c) for c in group["consumers"]} == {_aliases(schemas.ConsumerView)}
        assert group["consumersDown"] == 0


async def test_a_groups_consumers_page_live_judged_by_the_reapers_rules(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    await fill(redis, "s:a", G, 4)
    await read(redis, "s:a", G, "dead-0", 4)
    for name in ("live-0", "live-1", "live-2"):
        await register(redis, "s:a", G, name)
    async for api in client_of(_app(make_settings)):
        await _beat(api, "live")
        path = f"/api/streams/s:a/groups/{G}/consumers"
        first = await api.get(path, params={"limit": 2})
        assert first.status_code == 200, first.text
        rows = {c["name"]: c for c in first.json()}
        assert list(rows) == ["dead-0", "live-0"]
        # "dead" never heartbeated: down, holding its 4 entries.
        assert (rows["dead-0"]["down"], rows["dead-0"]["pending"]) == (True, 4)
        assert rows["dead-0"]["downReasons"] == ["agent-never-heartbeated"]
        assert (rows["live-0"]["down"], rows["live-0"]["agentId"]) == (False, "live")
        assert first.headers["link"] == '<?limit=2&after=live-0>; rel="next"'
        rest = await api.get(path, params={"limit": 2, "after": "live-0"})
        assert [c["name"] for c in rest.json()] == ["live-1", "live-2"]
        # Read live: a consumer that joins now is on the next page at once.
        await register(redis, "s:a", G, "live-3")
        last = await api.get(path, params={"after": "live-2"})
        assert [c["name"] for c in last.json()] == ["live-3"]
        assert (await api.get("/api/streams/s:a/groups/nope/consumers")).status_code == 404
        assert (await api.get(f"/api/streams/other/groups/{G}/consumers")).status_code == 404


async def test_viewers_share_one_measurement_and_then_read_the_scans(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    await fill(redis, "s:a", G, 3)
    await read(redis, "s:a", G, "live-0", 3)
    async for api in client_of(_app(make_settings)):
        # No scan has measured the fleet yet: ten viewers at once cause one dry-run scan...
        answers = await asyncio.gather(*(api.get("/api/streams") for _ in range(5)))
        answers += await asyncio.gather(*(api.get("/ui/") for _ in range(5)))
        assert {a.status_code for a in answers} == {200}
        assert await _scans_run(api) == 1
        # ...which is not listed among the last scans: nobody asked for it.
        assert await _scans(engine) == 0
        # Polling reads that measurement; nothing re-reads Redis.
        as_of = {(await api.get("/api/streams")).json()[0]["asOf"] for _ in range(5)}
        assert len(as_of) == 1 and await _scans_run(api) == 1
        # A scan measures anew, and the views show it.
        await fill(redis, "s:a", G, 2, start=10)
        await read(redis, "s:a", G, "live-1", 2)
        [before] = (await api.get("/api/streams")).json()
        assert before["pending"] == 3
        scan = await api.post("/api/reaper/scan", params={"dryRun": "true"})
        assert scan.status_code == 200
        [after] = (await api.get("/api/streams")).json()
        assert after["pending"] == 5
        assert after["asOf"] > before["asOf"]


async def _scans_run(api: httpx.AsyncClient) -> float:
    """The scans this conductor ran (`rig_reaper_scans_total`, every outcome)."""
    text = (await api.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rig_reaper_scans_total{")
    )


async def test_views_and_console_pages_say_how_long_the_server_took(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    """`Server-Timing` on /api views and console pages (what the benchmarks time), not on the
    agents' event intake."""
    await fill(redis, "s:a", G, 1)
    async for api in client_of(_app(make_settings)):
        for path in ("/api/streams", "/api/agents", "/ui/"):
            answer = await api.get(path)
            assert answer.status_code == 200, (path, answer.text)
            timing = answer.headers.get("server-timing", "")
            assert timing.startswith("app;dur="), (path, timing)
            assert float(timing.removeprefix("app;dur=")) > 0
        beat = await api.post("/api/events", json={"type": "HEARTBEAT", "agentId": "live"})
        assert beat.status_code == 202
        assert "server-timing" not in beat.headers
