"""Requeue or delete all the dead letters that match, at size: a few thousand in a few seconds,
each still with its event-log row and its audit line."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events
from rig_conductor.settings import Settings

from .console_kit import OPERATOR, G, S, builder, client_of, sign_in

LETTERS = 3_000
WITHIN_S = 5.0  # one letter at a time took about 5 ms each: 16 s for these 3,000


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


async def test_all_that_match_in_a_few_seconds_each_recorded(
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await plant(redis, LETTERS)
    csrf = await sign_in(console, OPERATOR)
    caplog.set_level(logging.INFO)
    started = time.perf_counter()
    deleted = await console.post(
        "/ui/deadletters/delete",
        data={"csrf": csrf, "stream": S, "q": "beta", "all_matching": "true"},
    )
    took_delete = time.perf_counter() - started
    assert deleted.status_code == 303
    assert await redis.xlen(f"{S}:dlq") == LETTERS - LETTERS // 3
    started = time.perf_counter()
    requeued = await console.post(
        "/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "all_matching": "true"}
    )
    took_requeue = time.perf_counter() - started
    assert requeued.status_code == 303
    assert took_delete < WITHIN_S and took_requeue < WITHIN_S, (took_delete, took_requeue)
    left = LETTERS - LETTERS // 3
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
