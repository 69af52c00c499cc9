"""Attempts across the reaper and the API: reclaims fence the old owner, dead letters are final,
and recorded attempts can wear an entry out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, events
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .helpers import idle_at_least, owners, read, register

S, G = "rig:dispatch", "workers"


@pytest.fixture
async def api(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        streams=(S,),
        dispatch_stream=S,
        agent_ids=("dev-e", "qa-e"),
        entry_stale_ms=0,
        max_deliveries=3,
    )
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


async def post(api: httpx.AsyncClient, **event: Any) -> httpx.Response:
    return await api.post("/api/events", json=event)


def report(kind: str, consumer: str, entry: str, attempt: int | None = None) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": kind,
        "agentId": consumer.split("-")[0] + "-e",
        "consumer": consumer,
        "stream": S,
        "entryId": entry,
    }
    if attempt is not None:
        event["attempt"] = attempt
    return event


async def dispatched(api: httpx.AsyncClient, redis: Redis, owner: str) -> str:
    entry: str = (await post(api, type="ISSUE_ASSIGNED", issueId="rc-1", agentId="dev-e")).json()[
        "entryId"
    ]
    await redis.xgroup_create(S, G, id="0")
    await read(redis, S, G, owner, 1)
    await register(redis, S, G, "qa-e-0")
    await post(api, type="HEARTBEAT", agentId="qa-e", consumer="qa-e-0")
    return entry


async def state(engine: AsyncEngine, entry: str) -> tuple[str, int, str | None]:
    async with engine.connect() as conn:
        row = (await conn.execute(select(assignments).where(assignments.c.entry_id == entry))).one()
    return row.state, row.attempt, row.consumer


async def test_a_reclaim_fences_the_old_owner_before_the_target_starts(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = await dispatched(api, redis, "dev-e-0")
    started = await post(api, **report("WORK_STARTED", "dev-e-0", entry))
    assert started.json() == {"attempt": 1}
    await idle_at_least(redis, S, G, 10)  # the guard a claim carries is above 0
    assert (await api.post("/api/reaper/scan")).json()["reclaimed"] == 1
    assert await owners(redis, S, G) == {entry: "qa-e-0"}
    assert await state(engine, entry) == ("pending", 2, "qa-e-0")
    # The old owner wakes up and reports: fenced, although the target has not started yet.
    zombie = await post(api, **report("WORK_COMPLETED", "dev-e-0", entry, attempt=1))
    assert zombie.status_code == 409
    # The target's start takes the attempt the reclaim reserved for it.
    target = await post(api, **report("WORK_STARTED", "qa-e-0", entry))
    assert target.json() == {"attempt": 2}
    done = await post(api, **report("WORK_COMPLETED", "qa-e-0", entry, attempt=2))
    assert done.json()["state"] == "done"


async def test_recorded_attempts_wear_an_entry_out(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = await dispatched(api, redis, "dev-e-0")
    for _ in range(3):  # three runs reported, one Redis delivery
        assert (await post(api, **report("WORK_STARTED", "dev-e-0", entry))).status_code == 202
    await idle_at_least(redis, S, G, 10)  # the guard a claim carries is above 0
    scan = (await api.post("/api/reaper/scan")).json()
    assert (scan["deadLettered"], scan["reclaimed"]) == (1, 0)
    [(_, fields)] = await redis.xrange(f"{S}:dlq")
    assert fields["deliveries"] == "3" and fields["issueId"] == "rc-1"
    assert await owners(redis, S, G) == {}
    assert (await state(engine, entry))[0] == "dead"
    # Acked on the source: nobody holds it any more, so nobody may start it again.
    late = await post(api, **report("WORK_STARTED", "dev-e-0", entry))
    assert late.status_code == 409 and "no consumer holds" in late.json()["detail"]


async def test_dead_letters_are_listed_and_requeued(
    api: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = await dispatched(api, redis, "dev-e-0")
    for _ in range(3):
        await redis.xreadgroup(G, "dev-e-0", {S: "0"})  # delivered again and again: 4 in all
    await idle_at_least(redis, S, G, 10)  # the guard a claim carries is above 0
    assert (await api.post("/api/reaper/scan")).json()["deadLettered"] == 1
    [letter] = (await api.get("/api/deadletters", params={"stream": S})).json()
    assert {
        k: letter[k] for k in ("stream", "originalId", "group", "consumer", "deliveries", "reason")
    } == {
        "stream": S,
        "originalId": entry,
        "group": G,
        "consumer": "dev-e-0",
        "deliveries": 4,
        "reason": "max-deliveries",
    }
    assert letter["fields"]["issueId"] == "rc-1" and letter["fields"]["type"] == "ISSUE_ASSIGNED"
    assert (await api.get("/api/deadletters")).json() == [letter]  # the dispatch stream by default

    requeued = await api.post(
        "/api/deadletters/requeue", json={"stream": S, "dlqId": letter["dlqId"]}
    )
    assert requeued.status_code == 201
    new_id = requeued.json()["entryId"]
    assert requeued.json() == {"stream": S, "entryId": new_id, "dlqId": letter["dlqId"]}
    [(last_id, fields)] = await redis.xrevrange(S, count=1)
    assert last_id == new_id and new_id != entry
    assert fields["issueId"] == "rc-1" and "reason" not in fields and "originalId" not in fields
    assert await redis.xlen(f"{S}:dlq") == 0
    again = await api.post("/api/deadletters/requeue", json={"stream": S, "dlqId": letter["dlqId"]})
    assert again.status_code == 404
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(events).where(events.c.kind == "DEAD_LETTER_REQUEUED"))
        ).one()
    assert (row.entry_id, row.issue_id) == (new_id, "rc-1")
    assert row.detail == {"dlqId": letter["dlqId"], "by": "anonymous"}


async def test_requeue_rejects_an_impossible_id(api: httpx.AsyncClient) -> None:
    answer = await api.post(
        "/api/deadletters/requeue", json={"stream": S, "dlqId": "30842803941948955020-5"}
    )
    assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "dlqId"
