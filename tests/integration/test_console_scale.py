"""The pending page at size: a page of a 20,000-entry pending list costs what a page costs.

Measured on `private_redis`, so INFO commandstats and the slow log count this page's commands
and nobody else's."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.console import pages
from rig_conductor.settings import Settings

from .console_kit import OPERATOR, G, S, builder, client_of, sign_in

ENTRIES = 20_000


@pytest.fixture
async def console(
    make_settings: Callable[..., Settings],
    embedded_redis_url: str,
    private_redis: Redis,
    engine: AsyncEngine,
) -> AsyncIterator[httpx.AsyncClient]:
    make = builder(lambda **values: make_settings(**{**values, "redis_url": embedded_redis_url}))
    async for client in client_of(make()):
        yield client


async def xpending_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_xpending", {}).get("calls", 0))


async def test_a_page_of_a_long_pending_list_reads_one_page(
    console: httpx.AsyncClient, private_redis: Redis
) -> None:
    redis = private_redis
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    for start in range(0, ENTRIES, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for n in range(start, start + 5_000):
                pipe.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": f"rc-{n}"})
            await pipe.execute()
    read = await redis.xreadgroup(G, "dev-e-0", {S: ">"}, count=ENTRIES)
    ids = [entry_id for entry_id, _ in read[0][1]]
    assert len(ids) == ENTRIES
    await sign_in(console, OPERATOR)
    params = {"stream": S, "group": G, "consumer": "dev-e-0"}
    for after in (None, ids[ENTRIES // 2]):  # the first page, and one deep in the list
        await redis.config_resetstat()
        await redis.slowlog_reset()
        await redis.config_set("slowlog-log-slower-than", 0)  # log every command, with its args
        await redis.config_set("slowlog-max-len", 10_000)
        page = await console.get(
            "/ui/pending", params={**params, **({"after": after} if after else {})}
        )
        await redis.config_set("slowlog-log-slower-than", 10_000)
        assert page.status_code == 200
        shown = re.findall(r'<td class="mono">(\d+-\d+)</td>', page.text)
        start = 0 if after is None else ENTRIES // 2 + 1
        assert shown == ids[start : start + pages.PEL_PAGE]
        calls = await xpending_calls(redis)
        commands = [bytes(e["command"]).decode() for e in await redis.slowlog_get(10_000)]
        logged = [c.split() for c in commands if c.upper().startswith("XPENDING")]
        assert len(logged) == calls and 1 <= calls <= 3, logged
        for command in logged:
            # XPENDING key group: the summary (O(consumers)); with a range: COUNT within a page.
            if len(command) > 3:
                count = int(command[5] if command[3].upper() != "IDLE" else command[7])
                assert count <= pages.PEL_PAGE, command
        assert any(c[-1] == "dev-e-0" and int(c[5]) == pages.PEL_PAGE for c in logged), logged
