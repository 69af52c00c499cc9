"""Tokens bound to one agent (RIG_AGENT_TOKENS) on the real API: each speaks for its own agent
and consumers only, may do nothing else, and a refused event changes nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import (
    agent_heartbeats,
    assignments,
    consumer_heartbeats,
    events,
)
from rig_conductor.app import create_app
from rig_conductor.console import session
from rig_conductor.settings import Settings

from .helpers import read

S, G = "rig:dispatch", "workers"
DEV_E = "dev-e-token-0123456789"
DOTNET = "dotnet-token-0123456789"
DISPATCHER = "dispatcher-token-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def api(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        agent_ids=("dev-e", "dev-e-dotnet", "review-e"),
        streams=(S,),
        dispatch_stream=S,
        api_tokens=DISPATCHER,
        agent_tokens=f"dev-e:{DEV_E},dev-e-dotnet:{DOTNET}",
    )
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


def heartbeat(agent: str, consumer: str | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {"type": "HEARTBEAT", "agentId": agent}
    if consumer is not None:
        event["consumer"] = consumer
    return event


def work(kind: str, agent: str, consumer: str, entry: str, **extra: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "agentId": agent,
        "consumer": consumer,
        "stream": S,
        "entryId": entry,
        **extra,
    }


async def rows(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        return {
            table.name: (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            for table in (agent_heartbeats, consumer_heartbeats, assignments)
        }


async def test_a_bound_token_heartbeats_for_its_own_agent_and_consumers_only(
    api: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    own = [heartbeat("dev-e"), heartbeat("dev-e", "dev-e-rig-agent-runtime-0")]
    for event in own:
        assert (await api.post("/api/events", json=event, headers=bearer(DEV_E))).status_code == 202
    before = await rows(engine)
    foreign = [
        heartbeat("review-e"),  # another agent
        heartbeat("dev-e", "review-e-0"),  # another agent's consumer
        # The longest known prefix gives this consumer to dev-e-dotnet, not to dev-e.
        heartbeat("dev-e", "dev-e-dotnet-rig-agent-runtime-0"),
        heartbeat("dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-0"),
        heartbeat("brand-new-agent"),  # nor may it make up agents
    ]
    for event in foreign:
        answer = await api.post("/api/events", json=event, headers=bearer(DEV_E))
        assert answer.status_code == 403, event
        assert (
            "speaks for agent 'dev-e' only" in answer.json()["detail"]
            or "belongs to" in (answer.json()["detail"])
        )
    assert await rows(engine) == before  # a refused event changes nothing
    # dev-e-dotnet's own token may speak for that consumer.
    dotnet = heartbeat("dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-0")
    assert (await api.post("/api/events", json=dotnet, headers=bearer(DOTNET))).status_code == 202


async def test_a_bound_token_may_do_nothing_but_report(api: httpx.AsyncClient) -> None:
    dispatch = {"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev-e"}
    refused = [
        api.post("/api/events", json=dispatch, headers=bearer(DEV_E)),
        api.get("/api/agents", headers=bearer(DEV_E)),
        api.get("/api/streams", headers=bearer(DEV_E)),
        api.post("/api/reaper/scan", params={"dryRun": "true"}, headers=bearer(DEV_E)),
        api.get("/api/deadletters", headers=bearer(DEV_E)),
    ]
    for call in refused:
        assert (await call).status_code == 403
    # The unbound dispatcher's token still may.
    dispatched = await api.post("/api/events", json=dispatch, headers=bearer(DISPATCHER))
    assert dispatched.status_code == 201
    # Nor does it open the console.
    assert session.sign_in(api_tokens(api), DEV_E) is None
    assert session.sign_in(api_tokens(api), DISPATCHER) is not None


def api_tokens(api: httpx.AsyncClient) -> Any:
    transport = api._transport
    assert isinstance(transport, httpx.ASGITransport)
    app: Any = transport.app
    return app.state.runtime.tokens


async def test_a_bound_token_reports_work_only_as_its_own_consumers(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    dispatch = {"type": "ISSUE_ASSIGNED", "issueId": "rc-2", "agentId": "dev-e"}
    entry = (await api.post("/api/events", json=dispatch, headers=bearer(DISPATCHER))).json()[
        "entryId"
    ]
    with contextlib.suppress(ResponseError):
        await redis.xgroup_create(S, G, id="0")
    await read(redis, S, G, "review-e-0", 1)  # review-e holds it
    # dev-e's token may not start, or report on, review-e's entry under review-e's name ...
    as_review = work("WORK_STARTED", "dev-e", "review-e-0", entry)
    assert (await api.post("/api/events", json=as_review, headers=bearer(DEV_E))).status_code == 403
    # ... nor under its own name, since it does not hold the entry.
    as_dev = work("WORK_STARTED", "dev-e", "dev-e-0", entry)
    refused = await api.post("/api/events", json=as_dev, headers=bearer(DEV_E))
    assert refused.status_code == 409 and "does not hold" in refused.json()["detail"]
    # A work report must say which consumer sends it.
    anonymous = {k: v for k, v in as_dev.items() if k != "consumer"}
    assert (await api.post("/api/events", json=anonymous, headers=bearer(DEV_E))).status_code == 422
    async with engine.connect() as conn:
        logged = await conn.execute(select(func.count()).where(events.c.kind.like("WORK_%")))
        assert logged.scalar_one() == 0
    # Once its consumer holds the entry, it works as before.
    await redis.xclaim(S, G, "dev-e-0", 0, [entry], justid=True)
    started = await api.post("/api/events", json=as_dev, headers=bearer(DEV_E))
    assert started.json() == {"attempt": 1}
    done = work("WORK_COMPLETED", "dev-e", "dev-e-0", entry, attempt=1)
    assert (await api.post("/api/events", json=done, headers=bearer(DEV_E))).status_code == 202


async def test_an_agent_heard_from_is_known_to_the_rule_at_once(
    api: httpx.AsyncClient,
) -> None:
    """An agent id first heard through an unbound token takes its consumers away from a shorter
    prefix at once: dev-e's token may no longer speak for them."""
    consumer = "dev-e-java-pod-0"
    event = heartbeat("dev-e", consumer)
    assert (await api.post("/api/events", json=event, headers=bearer(DEV_E))).status_code == 202
    java = heartbeat("dev-e-java", consumer)
    assert (await api.post("/api/events", json=java, headers=bearer(DISPATCHER))).status_code == 202
    assert (await api.post("/api/events", json=event, headers=bearer(DEV_E))).status_code == 403
