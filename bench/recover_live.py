"""Time to recover from an owner that stays alive: degraded (rule 3b) and hung (rule 4b).

The real conductor (uvicorn, the scheduled reaper) and real agent runtimes (`run_agent`) run in
this process against real Redis and PostgreSQL; recovery counts only once the stuck work is
completed by another consumer, acked and recorded.

- degraded: the owner holds the entries and heartbeats `degraded: true`, alive. The old rules
  never free its entries while it heartbeats; the nearest baseline is the agent-down path, which
  starts only once its heartbeats stop: RIG_AGENT_DOWN_MS (10 min by default). Measured: the
  first degraded heartbeat -> the last of its entries completed elsewhere, against the grace.
- hung: the owner's handler blocks on one entry, no progress, while its agent heartbeats.
  Measured: the hang -> that entry completed elsewhere, against RIG_ENTRY_DEADLINE_MS.

    .venv/bin/python bench/recover_live.py [--entries 200] [--grace-s 3] [--deadline-s 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from redis.asyncio import Redis

from reclaim import servers
from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import queries
from rig_conductor.agent import Entry, run_agent
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.settings import Settings

STREAM, GROUP = "bench:live", "agents"
OWNER, PEERS = "dev-e-0", ("dev-e-1", "dev-e-2")
SCAN_S = 0.5


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:  # the benchmark handles its own signals
        yield


@contextlib.asynccontextmanager
async def conductor(settings: Settings) -> AsyncIterator[str]:
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=settings.http_port, log_config=None
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn exposes no event
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{settings.http_port}"
    finally:
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def agents(
    url: str, redis_url: str, handlers: dict[str, Callable[[Entry], Any]], deadline_s: float
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    settings = AgentSettings(
        redis_url=redis_url,
        conductor_url=url,
        heartbeat_interval_s=0.25,
        scan_interval_s=SCAN_S,
        entry_deadline_ms=round(deadline_s * 1000),
        dispatch_stream=STREAM,
    )
    tasks = [
        asyncio.create_task(
            run_agent(
                handler,
                agent_id="dev-e",
                group=GROUP,
                settings=settings,
                consumer=name,
                stop=stop,
                shutdown_grace_s=0.5,
                block_ms=100,
            )
        )
        for name, handler in handlers.items()
    ]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


async def fill(redis: Redis, entries: int, owner: str) -> None:
    await redis.flushdb()
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(entries):
            pipe.xadd(STREAM, {"issueId": f"rc-{i}"})
        await pipe.execute()
    if entries:
        await redis.xreadgroup(GROUP, owner, {STREAM: ">"}, count=entries)


async def drained(redis: Redis) -> None:
    while (await redis.xpending(STREAM, GROUP))["pending"]:  # noqa: ASYNC110
        await asyncio.sleep(0.02)


def done(entry: Entry) -> None:
    time.sleep(0.001)


async def degraded(settings: Settings, redis: Redis, entries: int) -> float:
    """The owner never runs a handler: it only heartbeats, degraded, as a quota-bound pod."""
    await fill(redis, entries, OWNER)
    engine = pg_engine.create_engine(settings.sqlalchemy_url, pool_size=1)
    beat = [queries.HeartbeatIn(AgentId("dev-e"), ConsumerName(OWNER), True, ("quota",))]
    try:
        async with (
            conductor(settings) as url,
            agents(url, settings.redis_url, dict.fromkeys(PEERS, done), 3600),
        ):
            started = time.perf_counter()
            waiting = asyncio.create_task(drained(redis))
            while not waiting.done():
                await queries.record_heartbeats(engine, tenant=settings.tenant, heartbeats=beat)
                await asyncio.wait({waiting}, timeout=0.25)
            return time.perf_counter() - started
    finally:
        await engine.dispose()


async def hung(settings: Settings, redis: Redis, deadline_s: float) -> float:
    release = threading.Event()
    hanging = threading.Event()

    def stuck(entry: Entry) -> None:
        hanging.set()
        release.wait(60)

    await fill(redis, 0, OWNER)
    await redis.xadd(STREAM, {"issueId": "rc-hung"})
    handlers: dict[str, Callable[[Entry], Any]] = {OWNER: stuck}
    try:
        async with (
            conductor(settings) as url,
            agents(url, settings.redis_url, handlers, deadline_s),
        ):
            while not hanging.is_set():  # noqa: ASYNC110 - set from the handler's thread
                await asyncio.sleep(0.005)
            started = time.perf_counter()
            async with agents(url, settings.redis_url, dict.fromkeys(PEERS, done), deadline_s):
                await drained(redis)
                return time.perf_counter() - started
    finally:
        release.set()


async def run(args: argparse.Namespace) -> int:
    with servers() as found:
        base = Settings(
            redis_url=found.redis_url,
            database_url=found.database_url,
            streams=(STREAM,),
            agent_ids=("dev-e",),
            scan_interval_s=SCAN_S,
            startup_delay_s=0,
            k8s_enabled="false",
            http_port=_free_port(),
            tenant=f"bench-live-{uuid.uuid4().hex[:8]}",  # no heartbeats of earlier runs
        )
        redis = redis_streams.connect(found.redis_url)
        try:
            grace = base.model_copy(update={"degraded_grace_ms": round(args.grace_s * 1000)})
            took = await degraded(grace, redis, args.entries)
            down = base.agent_down_ms / 1000
            print("rig-conductor time to recover from an owner that stays alive")
            print(
                f"  degraded: {args.entries} entries, grace {args.grace_s:g} s, scans every "
                f"{SCAN_S:g} s -> all completed elsewhere after {took:.2f} s "
                f"({took - args.grace_s:.2f} s past the grace)"
            )
            print(
                f"    baseline, the agent-down path: {down:.0f} s after the last heartbeat, and "
                f"never while degraded heartbeats go on ({down / took:.0f}x slower at least)"
            )
            deadline = base.model_copy(update={"entry_deadline_ms": round(args.deadline_s * 1000)})
            took = await hung(deadline, redis, args.deadline_s)
            print(
                f"  hung: deadline {args.deadline_s:g} s -> completed elsewhere after {took:.2f} s "
                f"({took - args.deadline_s:.2f} s past the deadline)"
            )
        finally:
            await redis.aclose()
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> int:
    import logging
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=200)
    parser.add_argument("--grace-s", type=float, default=3.0)
    parser.add_argument("--deadline-s", type=float, default=3.0)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
