"""What one client can make the conductor hold or write is bounded: consumers per agent
(RIG_MAX_CONSUMERS_PER_AGENT), names without format characters, dead letters of watched streams
only, and refusals logged at a bounded rate. On the real API, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import event, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import consumer_heartbeats
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

S = "rig:dispatch"
DISPATCHER = "dispatcher-token-0123456789"
DEV_E = "dev-e-token-0123456789"
LIMIT = 3


def bearer(token: str = DISPATCHER) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def heartbeat(agent: str, consumer: str | None = None) -> dict[str, Any]:
    beat: dict[str, Any] = {"type": "HEARTBEAT", "agentId": agent}
    return {**beat, "consumer": consumer} if consumer is not None else beat


@pytest.fixture
def build(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> Callable[..., FastAPI]:
    def make(**overrides: Any) -> FastAPI:
        values: dict[str, Any] = {
            "agent_ids": ("dev-e", "qa-e"),
            "streams": (S, "assignments:*"),
            "dispatch_stream": S,
            "api_tokens": DISPATCHER,
            "agent_tokens": f"dev-e:{DEV_E}",
            "max_consumers_per_agent": LIMIT,
            **overrides,
        }
        return create_app(make_settings(**values), schedule_reaper=False)

    return make


@asynccontextmanager
async def client_of(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


async def registered(engine: AsyncEngine, agent: str) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(consumer_heartbeats.c.consumer).where(consumer_heartbeats.c.agent_id == agent)
        )
        return {consumer for (consumer,) in rows}


async def beat(client: httpx.AsyncClient, agent: str, consumer: str | None = None) -> int:
    answer = await client.post("/api/events", json=heartbeat(agent, consumer), headers=bearer())
    return answer.status_code


async def test_an_agent_registers_at_most_its_limit_of_consumers(
    build: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    async with client_of(build()) as client:
        for n in range(LIMIT):
            assert await beat(client, "dev-e", f"dev-e-{n}") == 202
        refused = await client.post(
            "/api/events", json=heartbeat("dev-e", "dev-e-extra"), headers=bearer()
        )
        assert refused.status_code == 409
        assert "RIG_MAX_CONSUMERS_PER_AGENT" in refused.json()["detail"]
        assert await registered(engine, "dev-e") == {f"dev-e-{n}" for n in range(LIMIT)}
        # The known ones keep being heard; the agent itself, and other agents, too.
        assert await beat(client, "dev-e", "dev-e-0") == 202
        assert await beat(client, "dev-e") == 202
        assert await beat(client, "qa-e", "qa-e-0") == 202
    # Another process (a replica, a restart) knows nothing in memory: the registry decides.
    async with client_of(build()) as client:
        assert await beat(client, "dev-e", "dev-e-1") == 202
        assert await beat(client, "dev-e", "dev-e-extra") == 409
    async with client_of(build(max_consumers_per_agent=LIMIT + 1)) as client:
        assert await beat(client, "dev-e", "dev-e-extra") == 202


async def test_concurrent_new_consumers_do_not_slip_past_the_limit(
    build: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    async with client_of(build()) as client:
        answers = await asyncio.gather(*(beat(client, "dev-e", f"dev-e-{n}") for n in range(12)))
    assert sorted(answers) == [202] * LIMIT + [409] * (12 - LIMIT)
    assert len(await registered(engine, "dev-e")) == LIMIT


async def test_a_known_consumer_costs_no_query(
    build: Callable[..., FastAPI], engine: AsyncEngine
) -> None:
    app = build()
    async with client_of(app) as client:
        assert await beat(client, "dev-e", "dev-e-0") == 202  # new: looked up once
        statements: list[str] = []
        sync_engine = app.state.runtime.engine.sync_engine

        def counted(*args: Any) -> None:
            statements.append(str(args[2]))

        event.listen(sync_engine, "before_cursor_execute", counted)
        try:
            for _ in range(20):
                assert await beat(client, "dev-e", "dev-e-0") == 202
        finally:
            event.remove(sync_engine, "before_cursor_execute", counted)
    assert statements == []  # the heartbeats themselves go through the writer's connection


@pytest.mark.parametrize(
    "bad",
    [
        "dev-e\u202e0-",  # right-to-left override
        "dev-e\u200b",  # zero-width space
        "\ufeffdev-e",  # zero-width no-break space (BOM)
        "dev-e\u2066x\u2069",  # bidi isolates
        "dev-e\u00ad0",  # soft hyphen
    ],
)
async def test_names_with_format_characters_are_refused(
    build: Callable[..., FastAPI], engine: AsyncEngine, bad: str
) -> None:
    async with client_of(build()) as client:
        for body, field in (
            (heartbeat(bad), "agentId"),
            (heartbeat("dev-e", bad), "consumer"),
        ):
            answer = await client.post("/api/events", json=body, headers=bearer())
            assert answer.status_code == 422, body
            assert answer.json()["detail"].startswith(f"{field}: ")
            assert "format characters" in answer.json()["detail"]
        pending = await client.get(f"/api/streams/{S}/groups/{bad}/consumers", headers=bearer())
        assert pending.status_code == 422
    assert await registered(engine, "dev-e") == set()


async def test_dead_letters_only_of_a_watched_stream(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    await redis.xadd("rig:staged:dlq", {"secret": "x"})
    async with client_of(build()) as client:
        for watched in (S, "assignments:dev-e"):
            answer = await client.get(f"/api/deadletters?stream={watched}", headers=bearer())
            assert answer.status_code == 200, answer.text
        assert (await client.get("/api/deadletters", headers=bearer())).status_code == 200
        for other in ("rig:staged", "assignments:*", "rig:dispatch:dlq"):
            answer = await client.get(
                "/api/deadletters", params={"stream": other}, headers=bearer()
            )
            assert answer.status_code == 422, other
            assert answer.json()["detail"].startswith("stream: ")
            assert answer.json()["errors"][0]["field"] == "stream"


async def test_a_flood_of_refusals_logs_a_bounded_number_of_lines(
    build: Callable[..., FastAPI], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = build()
    now = [1000.0]
    app.state.refusal_log.clock = lambda: now[0]
    async with client_of(app) as client:
        for _ in range(200):  # dev-e's token speaking for qa-e: 403 every time
            answer = await client.post("/api/events", json=heartbeat("qa-e"), headers=bearer(DEV_E))
            assert answer.status_code == 403
        refused = [r for r in caplog.records if r.getMessage().startswith("Refused HEARTBEAT")]
        access = [r for r in caplog.records if r.getMessage().startswith("POST /api/events 403")]
        assert 1 <= len(refused) <= 10 and 1 <= len(access) <= 10
        caplog.clear()
        now[0] += 61  # the next window: one summary of what was left out, then lines again
        answer = await client.post("/api/events", json=heartbeat("qa-e"), headers=bearer(DEV_E))
        assert answer.status_code == 403
    summaries = [r.getMessage() for r in caplog.records if "suppressed" in r.getMessage()]
    assert "Refused speaker: 190 more like this suppressed in the last 61 s" in summaries
    assert "HTTP 403: 190 more like this suppressed in the last 61 s" in summaries
    assert any(r.getMessage().startswith("Refused HEARTBEAT") for r in caplog.records)
