"""An accepted completion's staged outputs are published exactly once, whatever dies when.

The sequence that once lost an output for good, planted step by step with real processes
(`rig-conductor serve`, `rig-conductor agent`, a private redis-server without persistence):

1. an agent's WORK_COMPLETED, with its staged output, is accepted;
2. the agent is SIGKILLed before it publishes (renames) the file;
3. the entry moves twice, to consumers that die too;
4. Redis restarts empty.

The acceptance and the outputs it must publish were recorded in PostgreSQL in one transaction:
the conductor's recovery appends the dispatch again carrying the accepted completion, and the
agent that reads it publishes the accepted attempt's file, without running the handler again.
The kill lands exactly between acceptance and publication: the agent's conductor is a proxy
that forwards the completion, sees it accepted, and kills the agent before answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, dispatches
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    Fleet,
    calls,
    conductor_env,
    dispatch,
    effects,
    staged_leftovers,
)
from tests.e2e.fleet import pending as pending_of

from .helpers import serve, wait_for
from .restartable import RestartableRedis

pytestmark = pytest.mark.timeout(300)
WITHIN = 90.0
ISSUE = "rc-publish"


class KillOnAcceptance:
    """An HTTP proxy in front of the conductor for one agent: every request is forwarded; when a
    WORK_COMPLETED is answered 202, the agent (`pid`) is SIGKILLed before the answer reaches
    it. One request per connection (`Connection: close`)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.pid: int | None = None
        self.accepted: list[dict[str, object]] = []
        self._client = httpx.AsyncClient(base_url=upstream)
        self._server: asyncio.Server | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            self._server.close()
            await self._client.aclose()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int(headers.get("content-length") or headers.get("Content-Length") or 0)
            body = await reader.readexactly(length) if length else b""
            answer = await self._client.request(
                method, path, content=body, headers={"content-type": "application/json"}
            )
            event = json.loads(body) if body else {}
            if event.get("type") == "WORK_COMPLETED" and answer.status_code == 202:
                self.accepted.append(event)
                assert self.pid is not None
                os.kill(self.pid, signal.SIGKILL)
                return  # the agent never hears that it was accepted
            writer.write(
                f"HTTP/1.1 {answer.status_code} X\r\ncontent-type: application/json\r\n"
                f"content-length: {len(answer.content)}\r\nconnection: close\r\n\r\n".encode()
                + answer.content
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def entry_of(engine: AsyncEngine, issue: str) -> str:
    async with engine.connect() as conn:
        found = await conn.scalar(
            select(dispatches.c.entry_id).where(dispatches.c.idempotency_key == issue)
        )
    return str(found)


async def published_at(engine: AsyncEngine, entry_id: str) -> object:
    async with engine.connect() as conn:
        return await conn.scalar(
            select(assignments.c.published_at).where(assignments.c.entry_id == entry_id)
        )


async def test_an_output_accepted_then_killed_moved_and_lost_with_redis_is_published_once(
    restartable_redis: RestartableRedis, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    redis = Redis.from_url(restartable_redis.url, decode_responses=True)
    async with (
        contextlib.aclosing(redis),
        serve(restartable_redis.url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        proxy = KillOnAcceptance(conductor.url)
        async with proxy.running() as proxied:
            with Fleet(
                restartable_redis.url, conductor.url, tmp_path, env={"E2E_OUT_DIR": str(out)}
            ) as fleet:
                # 1-2. The victim builds the issue; its completion is accepted, and it dies
                # before renaming the staged file.
                victim = fleet.start("builder", "builder-victim", RIG_CONDUCTOR_URL=proxied)
                proxy.pid = victim.process.pid
                await dispatch(api, ISSUE, {})
                await wait_for(lambda: victim.process.poll() is not None, within=WITHIN)
                assert [event["attempt"] for event in proxy.accepted] == [1]
                first = await entry_of(engine, ISSUE)
                assert await published_at(engine, first) is None
                assert effects(out) == {} and len(staged_leftovers(out)) == 1

                # 3. The entry moves twice, to consumers that die before they read it.
                for consumer in ("builder-b", "builder-c"):
                    moved = await redis.xclaim(STREAM, GROUP, consumer, 0, [first], justid=True)
                    assert moved == [first]
                assert await pending_of(redis) == {first: "builder-c"}

                # 4. Redis restarts empty: the entry, its pending list and its group are gone.
                restartable_redis.restart_empty()

                async def appended_again() -> bool:
                    return await entry_of(engine, ISSUE) != first

                await wait_for(appended_again, within=WITHIN)

                # An agent reads the appended entry: it is told the completion was accepted
                # and publishes the accepted attempt's file, without running the handler.
                fleet.start("builder", "builder-d")
                await wait_for(lambda: ISSUE in effects(out), within=WITHIN)

                async def settled() -> bool:
                    try:
                        return await pending_of(redis) == {}
                    except Exception:  # the group is not there again yet
                        return False

                await wait_for(settled, within=WITHIN)
                again = await entry_of(engine, ISSUE)
                assert await published_at(engine, again) is not None

    effect = effects(out)[ISSUE]
    assert (effect["entryId"], effect["consumer"], effect["attempt"]) == (
        first,
        "builder-victim",
        1,
    )
    assert calls(out, ISSUE) == [f"{ISSUE}.builder-victim.a1"]  # the handler ran once
    assert staged_leftovers(out) == []
    assert "publishes them" in conductor.stderr
