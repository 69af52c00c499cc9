"""Requeue or delete all the dead letters that match, at size: a few thousand in batches (one
Redis round trip and one COPY a batch), each still with its event-log row and its audit line.
How fast that is, `make bench` measures; these tests check the batches."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from unittest.mock import AsyncMock

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.operations import deadletters
from rig_conductor.settings import Settings

from .console_kit import OPERATOR, G, S, builder, client_of, sign_in

LETTERS = 3_000


@pytest.fixture
async def console(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_of(builder(make_settings)()):
        yield client


async def plant(redis: Redis, n: int) -> list[str]:
    """`n` dead letters, every third of repo beta."""
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(n):
            pipe.xadd(
                f"{S}:dlq",
                {
                    "originalId": f"1-{i}",
                    "stream": S,
                    "group": G,
                    "consumer": "dev-e-0",
                    "deliveries": "5",
                    "reason": "max-deliveries",
                    "issueId": f"rc-{i}",
                    "repo": "beta" if i % 3 == 0 else "alpha",
                },
            )
        return [str(i) for i in await pipe.execute()]


async def count(engine: AsyncEngine, kind: str) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(events).where(events.c.kind == kind)
        return int((await conn.execute(query)).scalar_one())


def spy(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> AsyncMock:
    """`module.name` still called, its awaits counted."""
    wrapped = AsyncMock(wraps=getattr(module, name))
    monkeypatch.setattr(module, name, wrapped)
    return wrapped


async def test_all_that_match_go_in_batches_each_recorded(
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await plant(redis, LETTERS)
    csrf = await sign_in(console, OPERATOR)
    caplog.set_level(logging.INFO)
    deletes = spy(monkeypatch, redis_writes, "delete_dead_letters")
    requeues = spy(monkeypatch, redis_writes, "requeue_many")
    copies = spy(monkeypatch, pg_writes, "append_events")
    deleted = await console.post(
        "/ui/deadletters/delete",
        data={"csrf": csrf, "stream": S, "q": "beta", "all_matching": "true"},
    )
    assert deleted.status_code == 303
    assert await redis.xlen(f"{S}:dlq") == LETTERS - LETTERS // 3
    # One Redis round trip and one COPY a batch, not one a letter.
    batches = math.ceil(LETTERS // 3 / deadletters.BATCH)
    assert (deletes.await_count, copies.await_count) == (batches, batches)
    requeued = await console.post(
        "/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "all_matching": "true"}
    )
    assert requeued.status_code == 303
    left = LETTERS - LETTERS // 3
    assert requeues.await_count == math.ceil(left / deadletters.BATCH)
    assert copies.await_count == batches + requeues.await_count
    assert await redis.xlen(f"{S}:dlq") == 0 and await redis.xlen(S) == left
    issues = {fields["issueId"] for _, fields in await redis.xrange(S)}
    assert issues == {f"rc-{i}" for i in range(LETTERS) if i % 3}
    assert await count(engine, "DEAD_LETTER_DELETED") == LETTERS // 3
    assert await count(engine, "DEAD_LETTER_REQUEUED") == left
    text = caplog.text
    assert text.count("[Console] operator:") >= LETTERS  # one audit line per letter
    assert text.count(" deleted dead letter ") == LETTERS // 3
    assert text.count(" requeued dead letter ") == left


async def test_the_selected_go_in_one_batch_and_ids_already_gone_are_not_counted(
    console: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    ids = await plant(redis, 600)
    csrf = await sign_in(console, OPERATOR)
    await redis.xdel(f"{S}:dlq", ids[0])  # gone before the request
    answer = await console.post(
        "/ui/deadletters/delete", data={"csrf": csrf, "stream": S, "ids": ids[:550]}
    )
    assert "done=deleted&n=549" in answer.headers["location"]
    assert await redis.xlen(f"{S}:dlq") == 50
    assert await count(engine, "DEAD_LETTER_DELETED") == 549
