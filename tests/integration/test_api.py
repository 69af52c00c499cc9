"""The HTTP API in-process (real lifespan, real Redis and PostgreSQL) through httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import migrations, queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.postgres.tables import agent_heartbeats, dispatches, events
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .helpers import fill, heartbeats_stored, idle_at_least, owners, read, register


async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://conductor") as client:
            yield client


@pytest.fixture
def build(make_settings: Callable[..., Settings]) -> Callable[..., FastAPI]:
    def make(**overrides: Any) -> FastAPI:
        values: dict[str, Any] = {"agent_ids": ("dev-e", "qa-e"), "streams": ("rig:dispatch",)}
        values.update(overrides)
        return create_app(make_settings(**values), schedule_reaper=False)

    return make


@pytest.fixture
async def api(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(build()):
        yield client


def heartbeat(
    agent: str = "dev-e", consumer: str | None = "dev-e-0", **extra: Any
) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "HEARTBEAT", "agentId": agent, **extra}
    if consumer:
        event["consumer"] = consumer
    return event


def assigned(issue: str = "rc-959", **extra: Any) -> dict[str, Any]:
    return {
        "type": "ISSUE_ASSIGNED",
        "issueId": issue,
        "agentId": "dev-e",
        "payload": {"pr": 955},
        **extra,
    }


async def test_heartbeat_is_stored_and_shown(api: httpx.AsyncClient) -> None:
    answer = await api.post(
        "/api/events", json=heartbeat(degraded=True, degradedReasons=["codex_quota"])
    )
    assert (answer.status_code, answer.json()) == (202, {"accepted": True})
    agents = (await api.get("/api/agents")).json()
    by_id = {a["agentId"]: a for a in agents}
    assert set(by_id) == {"dev-e", "qa-e"}
    dev = by_id["dev-e"]
    assert (
        dev["down"] is False
        and dev["degraded"] is True
        and dev["degradedReasons"] == ["codex_quota"]
    )
    assert dev["consumers"] == ["dev-e-0"] and 0 <= dev["heartbeatAgeMs"] < 60_000
    datetime.fromisoformat(dev["lastHeartbeatAt"])
    assert by_id["qa-e"] == {
        "agentId": "qa-e",
        "lastHeartbeatAt": None,
        "heartbeatAgeMs": None,
        "down": True,
        "degraded": False,
        "degradedReasons": [],
        "consumers": [],
        "consumerCount": 0,
    }


async def test_concurrent_heartbeats_share_commits(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    answers = await asyncio.gather(
        *(
            api.post("/api/events", json=heartbeat(f"agent-{i % 7}", f"agent-{i % 7}-{i}"))
            for i in range(200)
        )
    )
    assert {a.status_code for a in answers} == {202}
    assert await heartbeats_stored(engine) == 200
    async with engine.connect() as conn:
        stamps = (
            await conn.execute(
                text("SELECT count(DISTINCT last_heartbeat_at) FROM consumer_heartbeats")
            )
        ).scalar_one()
    assert stamps < 200  # group commit: several heartbeats per transaction
    # The metrics count every heartbeat of every committed batch.
    exposition = (await api.get("/metrics")).text
    assert "rig_heartbeats_received_total 200.0" in exposition
    for agent in range(7):
        assert f'rig_agent_up{{agent="agent-{agent}"}} 1.0' in exposition


async def test_dispatch_appends_the_contract_fields(api: httpx.AsyncClient, redis: Redis) -> None:
    answer = await api.post("/api/events", json=assigned())
    assert answer.status_code == 201
    body = answer.json()
    assert body["stream"] == "rig:dispatch"
    [(entry_id, fields)] = await redis.xrange("rig:dispatch")
    assert entry_id == body["entryId"]
    assert set(fields) == {"type", "issueId", "agentId", "payload", "assignedAt"}
    assert (fields["type"], fields["issueId"], fields["agentId"]) == (
        "ISSUE_ASSIGNED",
        "rc-959",
        "dev-e",
    )
    assert json.loads(fields["payload"]) == {"pr": 955}
    assert datetime.fromisoformat(fields["assignedAt"]).tzinfo is not None


async def test_repeated_dispatch_appends_nothing(api: httpx.AsyncClient, redis: Redis) -> None:
    first = await api.post("/api/events", json=assigned())
    again = await api.post("/api/events", json=assigned())
    other_key = await api.post("/api/events", json=assigned(idempotencyKey="retry-2"))
    same_key = await api.post("/api/events", json=assigned("rc-960", idempotencyKey="retry-2"))
    assert (first.status_code, again.status_code, other_key.status_code, same_key.status_code) == (
        201,
        200,
        201,
        200,
    )
    assert again.json() == first.json()
    assert same_key.json() == other_key.json()
    assert await redis.xlen("rig:dispatch") == 2


async def test_fifty_concurrent_repeats_append_exactly_one_entry(
    api: httpx.AsyncClient, redis: Redis
) -> None:
    answers = await asyncio.gather(*(api.post("/api/events", json=assigned()) for _ in range(50)))
    assert sorted(a.status_code for a in answers) == [200] * 49 + [201]
    assert len({a.json()["entryId"] for a in answers}) == 1
    assert await redis.xlen("rig:dispatch") == 1


async def test_failed_append_leaves_nothing_that_blocks_a_retry(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    await redis.set("rig:dispatch", "not a stream")  # XADD fails with WRONGTYPE
    failed = await api.post("/api/events", json=assigned())
    assert failed.status_code == 503 and failed.headers["retry-after"] == "5"
    async with engine.connect() as conn:
        assert (await conn.execute(select(dispatches))).all() == []
    await redis.delete("rig:dispatch")
    retry = await api.post("/api/events", json=assigned())
    assert retry.status_code == 201
    assert await redis.xlen("rig:dispatch") == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "HEARTBEAT"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": 5}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": ""}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "a", "degraded": "yes"}, "degraded"),
        ({"type": "HEARTBEAT", "agentId": "a", "degradedReasons": "x"}, "degradedReasons"),
        ({"type": "ISSUE_ASSIGNED", "agentId": "a"}, "issueId"),
        ({"type": "ISSUE_ASSIGNED", "issueId": "i", "agentId": "a", "payload": [1]}, "payload"),
        ({"type": "WORK_STARTED", "agentId": "a", "stream": "s", "entryId": "nope"}, "entryId"),
        (
            {
                "type": "WORK_COMPLETED",
                "agentId": "a",
                "consumer": "a-0",
                "stream": "s",
                "entryId": "1-0",
                "attempt": 0,
            },
            "attempt",
        ),
        (
            {
                "type": "WORK_COMPLETED",
                "agentId": "a",
                "consumer": "a-0",
                "stream": "s",
                "entryId": "1-0",
                "attempt": "2",
            },
            "attempt",
        ),
        # Every report but a start names the attempt it reports on, and each names its consumer.
        *(
            (
                {"type": kind, "agentId": "a", "consumer": "a-0", "stream": "s", "entryId": "1-0"},
                "attempt",
            )
            for kind in ("WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED")
        ),
        (
            {"type": "WORK_STARTED", "agentId": "a", "stream": "s", "entryId": "1-0"},
            "consumer",
        ),
        ({"type": "HEARTBEAT", "agentId": "a\x00b"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "a", "degradedReasons": ["\ud800"]}, "degradedReasons.0"),
        (
            {
                "type": "WORK_STARTED",
                "agentId": "a",
                "stream": "s",
                "entryId": "99999999999999999999-0",
            },
            "entryId",
        ),
        ({"type": "NOPE"}, "body"),
        ({"agentId": "a"}, "body"),
        ([1, 2], "body"),
    ],
)
async def test_bad_events_answer_422_naming_the_field(
    api: httpx.AsyncClient, body: Any, field: str, redis: Redis
) -> None:
    # ASCII-escaped JSON, so lone surrogates travel as \\udXXX escapes.
    answer = await api.post(
        "/api/events", content=json.dumps(body), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 422
    assert answer.json()["detail"].startswith(f"{field}: ")
    assert answer.json()["errors"][0]["field"] == field
    assert await redis.exists("rig:dispatch") == 0


async def test_malformed_json_and_wrong_content_type(api: httpx.AsyncClient) -> None:
    broken = await api.post(
        "/api/events", content=b'{"type": "HEART', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["errors"][0]["type"] == "json_invalid"
    binary = await api.post(
        "/api/events", content=b"\xff\xfe\x00{", headers={"content-type": "application/json"}
    )
    assert binary.status_code == 422 and binary.json()["errors"][0]["field"] == "body"
    form = await api.post(
        "/api/events",
        content=b"type=HEARTBEAT",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert form.status_code == 422 and "Content-Type: application/json" in form.json()["detail"]


async def test_oversized_body_answers_413(api: httpx.AsyncClient, engine: AsyncEngine) -> None:
    big = heartbeat(degradedReasons=["x" * 200] * 400)
    answer = await api.post("/api/events", json=big)
    assert answer.status_code == 413
    chunks = [b'{"type":"HEARTBEAT","agentId":"', b"a" * 70_000, b'"}']

    async def stream() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    streamed = await api.post(
        "/api/events", content=stream(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert await heartbeats_stored(engine) == 0


async def test_a_streamed_body_within_the_limit_is_read_whole(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    body = json.dumps(heartbeat(degradedReasons=["r" * 250] * 60)).encode()  # ~15 KiB
    assert len(body) < 64 * 1024

    async def stream() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    answer = await api.post(
        "/api/events", content=stream(), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 202
    async with engine.connect() as conn:
        reasons = (await conn.execute(select(agent_heartbeats.c.degraded_reasons))).scalar_one()
    assert len(reasons) == 60


async def test_tokens_guard_the_api_but_not_probes(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine
) -> None:
    async for api in _client(build(api_tokens="alpha-token-0123456,beta-token-01234567")):
        assert (await api.post("/api/events", json=heartbeat())).status_code == 401
        wrong = await api.post(
            "/api/events", json=heartbeat(), headers={"Authorization": "Bearer gamma"}
        )
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        basic = await api.get("/api/agents", headers={"Authorization": "Basic alpha-token-0123456"})
        assert basic.status_code == 401
        ok = await api.post(
            "/api/events", json=heartbeat(), headers={"Authorization": "Bearer beta-token-01234567"}
        )
        assert ok.status_code == 202
        assert (await api.get("/healthz")).status_code == 200
        assert (await api.get("/readyz")).status_code == 200


async def test_redis_down_answers_503_and_heartbeats_still_work(
    build: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    async for api in _client(build(redis_url="redis://127.0.0.1:1/0")):
        answer = await api.post("/api/events", json=assigned())
        assert answer.status_code == 503 and answer.headers["retry-after"] == "5"
        assert "Redis" in answer.json()["detail"]
        assert (await api.post("/api/events", json=heartbeat())).status_code == 202
        ready = await api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["checks"]["redis"].startswith(
            "unavailable"
        )


async def test_postgres_down_answers_503(build: Callable[..., FastAPI], redis: Redis) -> None:
    async for api in _client(build(database_url="postgresql+psycopg://postgres@127.0.0.1:1/rig")):
        answer = await api.post("/api/events", json=heartbeat())
        assert answer.status_code == 503 and "PostgreSQL" in answer.json()["detail"]
        assert (await api.get("/readyz")).status_code == 503
        assert (await api.get("/healthz")).status_code == 200


async def test_a_dispatch_cut_off_before_its_record_is_completed_by_the_retry(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine
) -> None:
    # The append happened, PostgreSQL did not answer (or the process died right after).
    async for broken in _client(build(database_url="postgresql+psycopg://postgres@127.0.0.1:1/x")):
        cut_off = await broken.post("/api/events", json=assigned())
        assert cut_off.status_code == 503
    [(entry_id, _)] = await redis.xrange("rig:dispatch")
    # The client retries against a healthy conductor: the same entry, nothing appended again,
    # and the record is completed once.
    async for api in _client(build()):
        retry = await api.post("/api/events", json=assigned())
        again = await api.post("/api/events", json=assigned())
    assert (retry.status_code, again.status_code) == (200, 200)
    assert retry.json()["entryId"] == again.json()["entryId"] == entry_id
    assert await redis.xlen("rig:dispatch") == 1
    async with engine.connect() as conn:
        rows = (await conn.execute(select(dispatches))).all()
        recorded = await queries.count_events(engine, tenant="default", kind="ISSUE_ASSIGNED")
    assert [r.entry_id for r in rows] == [entry_id] and recorded == 1


def work(kind: str, consumer: str, entry: str, attempt: int | None = None) -> dict[str, Any]:
    event = {
        "type": kind,
        "agentId": "dev-e",
        "consumer": consumer,
        "stream": "rig:dispatch",
        "entryId": entry,
        "issueId": "rc-959",
    }
    if attempt is not None:
        event["attempt"] = attempt
    return event


async def read_as(redis: Redis, consumer: str) -> None:
    """`consumer` reads what the dispatch stream holds for it, as an agent's XREADGROUP does."""
    with contextlib.suppress(ResponseError):  # BUSYGROUP
        await redis.xgroup_create("rig:dispatch", "workers", id="0")
    await read(redis, "rig:dispatch", "workers", consumer, 10)


async def move(redis: Redis, engine: AsyncEngine, entry: str, to: str) -> None:
    """A reclaim of `entry` to `to`: the XCLAIM, and the new attempt reserved for it."""
    await redis.xclaim("rig:dispatch", "workers", to, 0, [entry], justid=True)
    await pg_writes.reclaimed(
        engine,
        tenant="default",
        stream="rig:dispatch",
        group="workers",
        consumer=to,
        entry_ids=[entry],
    )


async def work_rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        query = select(events.c.kind, events.c.attempt, events.c.fenced, events.c.detail)
        return list(
            await conn.execute(query.where(events.c.kind.like("WORK_%")).order_by(events.c.id))
        )


async def test_work_reports_are_fenced_by_attempt(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = (await api.post("/api/events", json=assigned())).json()["entryId"]
    await read_as(redis, "dev-e-0")
    first = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-0", entry))
    assert (first.status_code, first.json()) == (202, {"attempt": 1})
    await move(redis, engine, entry, "dev-e-1")
    second = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-1", entry))
    assert second.json() == {"attempt": 2}
    zombie = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-0", entry, attempt=1))
    assert zombie.status_code == 409
    assert zombie.json()["attempt"] == 2 and zombie.json()["state"] == "running"
    progress = await api.post(
        "/api/events", json=work("WORK_PROGRESS", "dev-e-1", entry, attempt=2)
    )
    assert (progress.status_code, progress.json()["accepted"]) == (202, True)
    stale_progress = await api.post(
        "/api/events", json=work("WORK_PROGRESS", "dev-e-0", entry, attempt=1)
    )
    assert stale_progress.status_code == 409
    done = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-1", entry, attempt=2))
    assert (done.status_code, done.json()) == (
        202,
        {"accepted": True, "attempt": 2, "state": "done"},
    )
    again = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-1", entry))
    assert again.status_code == 409 and again.json()["state"] == "done"
    failed = await api.post(
        "/api/events", json={**work("WORK_FAILED", "dev-e-0", entry, attempt=1), "error": "boom"}
    )
    assert failed.status_code == 202 and failed.json()["accepted"] is False
    rows = await work_rows(engine)
    assert [(r.kind, r.attempt, r.fenced) for r in rows] == [
        ("WORK_STARTED", 1, False),
        ("WORK_STARTED", 2, False),
        ("WORK_COMPLETED", 1, True),
        ("WORK_PROGRESS", 2, False),
        ("WORK_PROGRESS", 1, True),
        ("WORK_COMPLETED", 2, False),
        ("WORK_STARTED", None, True),
        ("WORK_FAILED", 1, True),
    ]
    assert rows[-1].detail == {"error": "boom"}


async def test_work_reports_come_from_the_entrys_owner_only(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = (await api.post("/api/events", json=assigned())).json()["entryId"]
    # Nobody holds it yet: nobody may start it.
    unread = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-0", entry))
    assert unread.status_code == 409 and unread.json()["detail"].startswith("refused:")
    await read_as(redis, "dev-e-0")
    await redis.xgroup_createconsumer("rig:dispatch", "workers", "dev-e-1")
    # Another consumer of the group, which does not hold it, may not start it ...
    stranger = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-1", entry))
    assert stranger.status_code == 409 and "does not hold" in stranger.json()["detail"]
    started = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-0", entry))
    assert started.json() == {"attempt": 1}
    # ... nor report on the holder's attempt, nor on one never made.
    for kind in ("WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED"):
        forged = await api.post("/api/events", json=work(kind, "dev-e-1", entry, attempt=1))
        assert forged.status_code == 409, kind
        assert "another consumer" in forged.json()["detail"]
    ahead = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-0", entry, attempt=2))
    assert ahead.status_code == 409 and "never made" in ahead.json()["detail"]
    # The refusals changed nothing: the holder's attempt runs on, and completes.
    assert [(r.kind, r.attempt, r.fenced) for r in await work_rows(engine)] == [
        ("WORK_STARTED", 1, False)
    ]
    done = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-0", entry, attempt=1))
    assert done.json() == {"accepted": True, "attempt": 1, "state": "done"}


async def test_the_target_of_a_reclaim_owns_the_attempt_it_reserved(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = (await api.post("/api/events", json=assigned())).json()["entryId"]
    await read_as(redis, "dev-e-0")
    await api.post("/api/events", json=work("WORK_STARTED", "dev-e-0", entry))
    await move(redis, engine, entry, "dev-e-1")
    # The reclaim made attempt 2 for dev-e-1: it may report on it before it even restarts.
    progress = await api.post(
        "/api/events", json=work("WORK_PROGRESS", "dev-e-1", entry, attempt=2)
    )
    assert progress.status_code == 202
    old_owner = await api.post(
        "/api/events", json=work("WORK_PROGRESS", "dev-e-0", entry, attempt=2)
    )
    assert old_owner.status_code == 409 and "another consumer" in old_owner.json()["detail"]


async def test_a_target_that_starts_right_after_the_move_is_not_fenced_by_it(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    """Reaper rule 6: the target starts the entry between the XCLAIM and the move's record of
    the new attempt. Its start took attempt 2 and fenced the old owner; the record leaves it
    there, so the target's completion counts and the entry runs once."""
    entry = (await api.post("/api/events", json=assigned())).json()["entryId"]
    await read_as(redis, "dev-e-0")
    await api.post("/api/events", json=work("WORK_STARTED", "dev-e-0", entry))
    await redis.xclaim("rig:dispatch", "workers", "dev-e-1", 0, [entry], justid=True)
    started = await api.post("/api/events", json=work("WORK_STARTED", "dev-e-1", entry))
    assert started.json() == {"attempt": 2}
    await pg_writes.reclaimed(
        engine,
        tenant="default",
        stream="rig:dispatch",
        group="workers",
        consumer="dev-e-1",
        entry_ids=[entry],
    )
    done = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-1", entry, attempt=2))
    assert done.status_code == 202 and done.json()["state"] == "done", done.text
    stale = await api.post("/api/events", json=work("WORK_COMPLETED", "dev-e-0", entry, attempt=1))
    assert stale.status_code == 409


async def test_streams_view_and_scan_on_demand(api: httpx.AsyncClient, redis: Redis) -> None:
    ids = await fill(redis, "rig:dispatch", "workers", 3)
    await read(redis, "rig:dispatch", "workers", "dev-e-rig-agent-runtime-0", 3)
    await register(redis, "rig:dispatch", "workers", "qa-e-0")
    await api.post("/api/events", json=heartbeat("qa-e", "qa-e-0"))
    [group] = (await api.get("/api/streams")).json()
    assert (group["stream"], group["group"], group["pending"]) == ("rig:dispatch", "workers", 3)
    consumers = {c["name"]: c for c in group["consumers"]}
    assert consumers["dev-e-rig-agent-runtime-0"]["agentId"] == "dev-e"
    assert consumers["dev-e-rig-agent-runtime-0"]["pending"] == 3
    assert consumers["qa-e-0"]["agentId"] == "qa-e"
    assert group["oldestPendingIdleMs"] >= 0
    await idle_at_least(redis, "rig:dispatch", "workers", 50)  # idle a while, yet not stale
    # entry_stale_ms is 5 min by default: nothing is stale yet.
    report = (await api.post("/api/reaper/scan", params={"dryRun": "true"})).json()
    assert (report["reclaimed"], report["dryRun"], report["pending"]) == (0, True, 3)
    assert await owners(redis, "rig:dispatch", "workers") == dict.fromkeys(
        ids, "dev-e-rig-agent-runtime-0"
    )


async def test_scan_on_demand_moves_stale_entries(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine
) -> None:
    ids = await fill(redis, "rig:dispatch", "workers", 2)
    await read(redis, "rig:dispatch", "workers", "dev-e-0", 2)
    await register(redis, "rig:dispatch", "workers", "qa-e-0")
    async for api in _client(build(entry_stale_ms=0)):
        await api.post("/api/events", json=heartbeat("qa-e", "qa-e-0"))
        dry = (await api.post("/api/reaper/scan?dryRun=true")).json()
        assert (dry["reclaimed"], dry["dryRun"]) == (2, True)
        assert await owners(redis, "rig:dispatch", "workers") == dict.fromkeys(ids, "dev-e-0")
        real = (await api.post("/api/reaper/scan?dryRun=false")).json()
        assert (real["reclaimed"], real["dryRun"]) == (2, False)
        assert await owners(redis, "rig:dispatch", "workers") == dict.fromkeys(ids, "qa-e-0")
        assert (await api.post("/api/reaper/scan?dryRun=maybe")).status_code == 422


async def test_readyz_knows_an_unmigrated_schema(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine, database_url: str
) -> None:
    async for api in _client(build()):
        assert (await api.get("/readyz")).json() == {
            "ready": True,
            "checks": {"redis": "ok", "postgres": "ok", "schema": "ok"},
        }
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
        try:
            behind = await api.get("/readyz")
            assert behind.status_code == 503 and behind.json()["checks"]["schema"].startswith(
                "at 0001"
            )
        finally:
            async with engine.begin() as conn:
                await conn.execute(
                    text("UPDATE alembic_version SET version_num = :head"),
                    {"head": migrations.head_revision(database_url)},
                )


async def test_openapi_describes_the_api(api: httpx.AsyncClient) -> None:
    spec = (await api.get("/openapi.json")).json()
    assert {
        "/api/events",
        "/api/agents",
        "/api/streams",
        "/api/reaper/scan",
        "/healthz",
        "/readyz",
    } <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    assert "agentId" in schemas["HeartbeatEvent"]["properties"]


async def test_request_log_has_no_bodies_or_tokens(
    build: Callable[..., FastAPI],
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async for api in _client(build(api_tokens="s3cret-token-0123")):
        with caplog.at_level("DEBUG", logger="rig_conductor.access"):
            await api.post(
                "/api/events",
                json=heartbeat("agent-with-secret-name"),
                headers={"Authorization": "Bearer s3cret-token-0123"},
            )
            await api.post(
                "/api/events",
                json={"type": "HEARTBEAT"},
                headers={"Authorization": "Bearer s3cret-token-0123"},
            )
            await api.get("/api/agents?token=s3cret-token-0123")
    lines = [r.getMessage() for r in caplog.records if r.name == "rig_conductor.access"]
    assert [line.rsplit(" ", 1)[0] for line in lines] == [
        "POST /api/events 202",
        "POST /api/events 422",
        "GET /api/agents 401",
    ]
    assert [r.levelname for r in caplog.records if r.name == "rig_conductor.access"] == [
        "DEBUG",
        "INFO",
        "INFO",
    ]
    assert "s3cret" not in caplog.text and "agent-with-secret-name" not in caplog.text
