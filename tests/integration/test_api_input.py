"""What a client names or leaves out: scan defaults, names, stream names, dead-letter fields.

Whatever a request carries, or a dead-letter stream holds, the answer is a 4xx naming the
problem or a best-effort view (in the API and the console alike), never a 500; and a setting
that says "change nothing" is not overridden by silence.
"""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .console_kit import OPERATOR, builder, client_of, sign_in
from .helpers import fill, owners, read, register

S, G = "rig:dispatch", "workers"


async def _client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://conductor") as client:
            yield client


def _build(make_settings: Callable[..., Settings], **overrides: Any) -> FastAPI:
    values: dict[str, Any] = {"agent_ids": ("dev-e", "qa-e"), "streams": (S,), "entry_stale_ms": 0}
    values.update(overrides)
    return create_app(make_settings(**values), schedule_reaper=False)


async def _stale_entries(redis: Redis) -> list[str]:
    """Two entries of a silent consumer, and a live target for them."""
    ids = await fill(redis, S, G, 2)
    await read(redis, S, G, "dev-e-0", 2)
    await register(redis, S, G, "qa-e-0")
    return ids


async def test_a_scan_without_dry_run_follows_rig_dry_run(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    ids = await _stale_entries(redis)
    async for api in _client(_build(make_settings, dry_run=True)):
        await api.post("/api/events", json={"type": "HEARTBEAT", "agentId": "qa-e"})
        report = (await api.post("/api/reaper/scan")).json()
        assert (report["reclaimed"], report["dryRun"]) == (2, True)
        assert await owners(redis, S, G) == dict.fromkeys(ids, "dev-e-0")
        explicit = (await api.post("/api/reaper/scan", params={"dryRun": "false"})).json()
        assert (explicit["reclaimed"], explicit["dryRun"]) == (2, False)
        assert await owners(redis, S, G) == dict.fromkeys(ids, "qa-e-0")


async def test_a_scan_without_dry_run_acts_when_rig_dry_run_is_off(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    ids = await _stale_entries(redis)
    async for api in _client(_build(make_settings)):
        await api.post("/api/events", json={"type": "HEARTBEAT", "agentId": "qa-e"})
        dry = (await api.post("/api/reaper/scan", params={"dryRun": "true"})).json()
        assert dry["dryRun"] is True
        assert await owners(redis, S, G) == dict.fromkeys(ids, "dev-e-0")
        report = (await api.post("/api/reaper/scan")).json()
        assert (report["reclaimed"], report["dryRun"]) == (2, False)
        assert await owners(redis, S, G) == dict.fromkeys(ids, "qa-e-0")


async def test_no_docs_page_loads_from_a_cdn_and_the_openapi_document_stays(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    async for api in _client(_build(make_settings, http_root_path="/rig")):
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect", "/rig/docs", "/rig/redoc"):
            answer = await api.get(path)
            assert answer.status_code == 404, path
            assert "cdn" not in answer.text.lower()
        spec = await api.get("/rig/openapi.json")
        assert spec.status_code == 200 and "/api/events" in spec.json()["paths"]


def _work(**fields: Any) -> dict[str, Any]:
    return {"type": "WORK_STARTED", "agentId": "dev-e", "stream": S, "entryId": "1-0", **fields}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "HEARTBEAT", "agentId": "dev-e\n2026-01-01 INFO x: [StreamReclaim]"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "dev-e", "consumer": "dev-e-0\r"}, "consumer"),
        ({"type": "HEARTBEAT", "agentId": "dev-e\x1b[31m"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "dev-e\u0085"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "dev-e\u2028"}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": "x" * 201}, "agentId"),
        ({"type": "HEARTBEAT", "agentId": ""}, "agentId"),
        (_work(stream="rig:\tdispatch"), "stream"),
        (_work(consumer="dev-e-0\x7f"), "consumer"),
        ({"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev\ne"}, "agentId"),
    ],
)
async def test_names_with_control_characters_answer_422_naming_the_field(
    make_settings: Callable[..., Settings],
    redis: Redis,
    engine: AsyncEngine,
    body: dict[str, Any],
    field: str,
) -> None:
    async for api in _client(_build(make_settings)):
        answer = await api.post("/api/events", json=body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["errors"][0]["field"] == field
        assert answer.json()["detail"].startswith(f"{field}: ")
        agents = (await api.get("/api/agents")).json()
        assert all(agent["lastHeartbeatAt"] is None for agent in agents)  # nothing stored
    assert await redis.exists(S) == 0


async def test_names_of_200_printable_characters_are_taken(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    name = "agent-\u00e9\U0001f600-" + "x" * 191
    assert len(name) == 200
    async for api in _client(_build(make_settings)):
        answer = await api.post("/api/events", json={"type": "HEARTBEAT", "agentId": name})
        assert answer.status_code == 202
        assert name in {agent["agentId"] for agent in (await api.get("/api/agents")).json()}


@pytest.mark.parametrize("stream", ["rig:\ndispatch", "x" * 201])
async def test_a_stream_parameter_with_control_characters_answers_422(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine, stream: str
) -> None:
    async for api in _client(_build(make_settings)):
        listed = await api.get("/api/deadletters", params={"stream": stream})
        assert listed.status_code == 422 and listed.json()["errors"][0]["field"] == "query.stream"
        deleted = await api.delete("/api/deadletters", params={"stream": stream, "dlqId": "1-0"})
        assert deleted.status_code == 422 and "stream" in deleted.json()["detail"]
        body = {"stream": stream, "dlqId": "1-0"}
        requeue = await api.post("/api/deadletters/requeue", json=body)
        assert requeue.status_code == 422 and requeue.json()["errors"][0]["field"] == "stream"


async def test_a_stream_name_redis_refuses_answers_4xx(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    await redis.hset("a-hash:dlq", "k", "v")  # the dead letters of `a-hash` are not a stream
    await redis.set("a-string", "x")  # a stream name that holds a string, with a dead letter
    letter = await redis.xadd("a-string:dlq", {"originalId": "1-0", "issueId": "rc-1"})
    # Watched streams (RIG_STREAMS): the dead letters of any other are refused before Redis.
    async for api in _client(_build(make_settings, streams=(S, "a-hash", "a-string"))):
        listed = await api.get("/api/deadletters", params={"stream": "a-hash"})
        assert listed.status_code == 422 and "WRONGTYPE" in listed.json()["detail"]
        params = {"stream": "a-hash", "dlqId": "1-0"}
        assert (await api.delete("/api/deadletters", params=params)).status_code == 422
        body = {"stream": "a-string", "dlqId": letter}
        requeue = await api.post("/api/deadletters/requeue", json=body)
        assert requeue.status_code == 422, requeue.text
    assert await redis.xlen("a-string:dlq") == 1  # the letter stays where it was


async def test_malformed_dead_letters_are_shown_best_effort(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    dlq = S + ":dlq"
    good = await redis.xadd(dlq, {"originalId": "1-0", "deliveries": "5", "issueId": "rc-1"})
    odd = await redis.xadd(dlq, {"originalId": "2-0", "deliveries": "five", "reason": "x"})
    bare = await redis.xadd(dlq, {"issueId": "rc-3"})
    binary = await redis.xadd(dlq, {"originalId": "4-0", "deliveries": "2", "blob": b"\xff\xfe"})
    async for api in _client(_build(make_settings)):
        answer = await api.get("/api/deadletters")
        assert answer.status_code == 200, answer.text
        letters = {letter["dlqId"]: letter for letter in answer.json()}
        assert letters[good]["deliveries"] == 5
        assert letters[odd]["deliveries"] is None and letters[odd]["reason"] == "x"
        assert letters[bare]["deliveries"] is None and letters[bare]["originalId"] == ""
        assert letters[bare]["fields"] == {"issueId": "rc-3"}
        assert letters[binary]["deliveries"] == 2 and letters[binary]["fields"]["blob"]


async def test_the_console_shows_requeues_and_deletes_malformed_dead_letters(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    dlq = S + ":dlq"
    odd = await redis.xadd(dlq, {"deliveries": "lots", "issueId": "rc-odd"})
    binary = await redis.xadd(dlq, {"deliveries": "-1", "issueId": "rc-bin", "blob": b"\xff"})
    async for console in client_of(builder(make_settings)()):
        csrf = await sign_in(console, OPERATOR)
        page = await console.get("/ui/deadletters", params={"stream": S})
        assert page.status_code == 200 and odd in page.text and binary in page.text
        found = await console.get("/ui/deadletters", params={"stream": S, "q": "rc-bin"})
        assert found.status_code == 200 and binary in found.text and odd not in found.text
        deleted = await console.post(
            "/ui/deadletters/delete", data={"csrf": csrf, "stream": S, "ids": [odd]}
        )
        assert deleted.status_code == 303
        requeued = await console.post(
            "/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "ids": [binary]}
        )
        assert requeued.status_code == 303
    assert await redis.xlen(dlq) == 0
    [(_, fields)] = await redis.execute_command("XRANGE", S, "-", "+", NEVER_DECODE=True)
    assert fields[b"blob"] == b"\xff"  # requeued byte for byte


async def test_a_newline_in_a_request_path_forges_no_log_line(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.TextFormatter())
    access = logging.getLogger("rig_conductor.access")
    access.addHandler(handler)
    level, disabled = access.level, access.disabled
    access.setLevel(logging.INFO)  # through setLevel: it clears the logger's level cache
    access.disabled = False
    forged = "%0A2026-11-26%2010:00:00,000%20INFO%20x:%20[StreamReclaim]%20Reclaimed%201-0%0D%1B"
    try:
        async for api in _client(_build(make_settings)):
            assert (await api.get("/api/agents" + forged)).status_code == 404
            assert (await api.get("/ui" + forged)).status_code == 404
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
        access.disabled = disabled
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and all(" rig_conductor.access: GET /" in line for line in lines)
    assert r"GET /api/agents\n2026-11-26 10:00:00,000 INFO x: [StreamReclaim] " in lines[0]
    assert r"Reclaimed 1-0\r\x1b 404 " in lines[0]
