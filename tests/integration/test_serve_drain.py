"""`serve` stops marking itself as listening as soon as its graceful shutdown stops taking
connections, not once the requests in flight have finished: while it drains, heartbeats are
refused, and that time must count as blind (reaper rule 3), not as heard."""

from __future__ import annotations

import asyncio
import signal
from urllib.parse import urlsplit

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .helpers import eventually, serve, wait_for

# Marks every 100 ms (a quarter of the slack, RIG_AGENT_DOWN_MS / 10).
AGENT_DOWN_MS = "4000"
DRAIN_S = 3.0


async def last_mark(engine: AsyncEngine) -> float | None:
    """The latest listening mark, in seconds on PostgreSQL's clock."""
    async with engine.connect() as conn:
        found = await conn.execute(text("SELECT extract(epoch FROM max(heard_to)) FROM listening"))
        value = found.scalar_one()
        return None if value is None else float(value)


async def database_now(engine: AsyncEngine) -> float:
    async with engine.connect() as conn:
        return float((await conn.execute(text("SELECT extract(epoch FROM now())"))).scalar_one())


async def test_a_draining_server_marks_itself_listening_no_more(
    engine: AsyncEngine, redis_url: str, database_url: str
) -> None:
    async with serve(redis_url, database_url, RIG_AGENT_DOWN_MS=AGENT_DOWN_MS) as conductor:
        address = urlsplit(conductor.url)
        assert address.hostname is not None and address.port is not None
        # A request in flight: its head and the first byte of its body. The graceful shutdown
        # waits for it (`serving.config` allows it 30 s).
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        writer.write(
            b"POST /api/events HTTP/1.1\r\nHost: rig\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        try:

            async def marking() -> None:
                assert (await last_mark(engine) or 0) > await database_now(engine) - 1

            await eventually(marking, within=30)
            conductor.process.send_signal(signal.SIGTERM)

            async def shutting_down() -> bool:
                return "Shutting down" in conductor.stderr

            await wait_for(shutting_down, within=30)
            seen = await database_now(engine)
            await asyncio.sleep(DRAIN_S)
            assert conductor.process.poll() is None, "the request in flight was not waited for"
            last = await last_mark(engine)
            assert last is not None
            # At most a mark already on its way as the shutdown began (a slow one, on a busy
            # machine); marking on would have reached `seen + DRAIN_S`.
            assert last < seen + DRAIN_S / 3, (
                f"marked listening {last - seen:.2f}s after its shutdown stopped taking connections"
            )
        finally:
            writer.close()
            await writer.wait_closed()
            del reader
    assert conductor.process.returncode == 0, conductor.stderr[-3000:]
