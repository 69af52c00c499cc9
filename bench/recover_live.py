"""Time to recover from an owner that stays alive: degraded (reaper rule 3b) and hung (rule 4b).

    .venv/bin/python bench/recover_live.py [--quick] [--entries 200] [--grace-s 3] [--deadline-s 3]

`rig-conductor serve` as a subprocess (scans every 0.5 s) and agent runtimes (`run_agent`) in this
process, real Redis and PostgreSQL; recovery counts once the stuck work is completed by another
consumer and acked.
- degraded: the owner holds the entries and heartbeats `degraded: true` over HTTP. Measured: the
  first degraded heartbeat -> the last of its entries completed elsewhere, against the grace.
  Baseline: the agent-down path, which starts only once the heartbeats stop (RIG_AGENT_DOWN_MS).
- hung: the owner's handler blocks on one entry without progress while its agent heartbeats.
  Measured: the hang -> that entry completed elsewhere, against RIG_ENTRY_DEADLINE_MS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

import harness
from harness import GROUP, TENANT, BenchError, Stores
from rig_conductor.agent import Entry, run_agent
from rig_conductor.agent.settings import AgentSettings

STREAM = "bench:live"
OWNER, PEERS = "dev-e-0", ("dev-e-1", "dev-e-2")
SCAN_S, AGENT_DOWN_S = 0.5, 600


@contextlib.asynccontextmanager
async def agents(
    url: str, stores: Stores, handlers: dict[str, Callable[[Entry], Any]], deadline_s: float
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    settings = AgentSettings(
        redis_url=stores.servers.redis_url,
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


def conductor(stores: Stores, **settings: object) -> dict[str, str]:
    """`serve` scanning every SCAN_S from the start."""
    return harness.conductor_env(
        stores.servers,
        streams=STREAM,
        agent_ids="dev-e",
        tenant=TENANT,
        scan_interval_s=SCAN_S,
        startup_delay_s=0,
        **settings,
    )


async def fill(stores: Stores, entries: int) -> None:
    await stores.reset()
    await harness.add_entries(stores.redis, STREAM, entries)
    await stores.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await harness.deliver(stores.redis, STREAM, [(OWNER, entries)])


async def drained(stores: Stores) -> None:
    while (await stores.redis.xpending(STREAM, GROUP))["pending"]:  # noqa: ASYNC110
        await asyncio.sleep(0.02)


def done(entry: Entry) -> None:
    time.sleep(0.001)


async def degraded(stores: Stores, entries: int, grace_s: float) -> float:
    """The owner never runs a handler: it only heartbeats, degraded, as a quota-bound pod."""
    await fill(stores, entries)
    beat = {"type": "HEARTBEAT", "agentId": "dev-e", "consumer": OWNER}
    beat |= {"degraded": True, "degradedReasons": ["quota"]}
    with harness.serve(conductor(stores, degraded_grace_ms=round(grace_s * 1000))) as url:
        async with (
            agents(url, stores, dict.fromkeys(PEERS, done), 3600),
            httpx.AsyncClient() as api,
        ):
            started = time.perf_counter()
            waiting = asyncio.create_task(drained(stores))
            while not waiting.done():
                if (await api.post(f"{url}/api/events", json=beat)).status_code != 202:
                    raise BenchError("the degraded heartbeat was not accepted")
                await asyncio.wait({waiting}, timeout=0.25)
            return time.perf_counter() - started


async def hung(stores: Stores, deadline_s: float) -> float:
    release, hanging = threading.Event(), threading.Event()

    def stuck(entry: Entry) -> None:
        hanging.set()
        release.wait(60)

    await fill(stores, 0)
    await stores.redis.xadd(STREAM, {"issueId": "rc-hung"})
    try:
        with harness.serve(conductor(stores, entry_deadline_ms=round(deadline_s * 1000))) as url:
            async with agents(url, stores, {OWNER: stuck}, deadline_s):
                while not hanging.is_set():  # noqa: ASYNC110 - set from the handler's thread
                    await asyncio.sleep(0.005)
                started = time.perf_counter()
                async with agents(url, stores, dict.fromkeys(PEERS, done), deadline_s):
                    await drained(stores)
                    return time.perf_counter() - started
    finally:
        release.set()


async def main(args: argparse.Namespace) -> int:
    async with harness.stores() as stores:
        print("rig-conductor time to recover from an owner that stays alive")
        print(await stores.describe())
        took = await degraded(stores, args.entries, args.grace_s)
        print(
            f"  degraded: {args.entries} entries, grace {args.grace_s:g} s, scans every "
            f"{SCAN_S:g} s -> all completed elsewhere after {took:.2f} s "
            f"({took - args.grace_s:.2f} s past the grace)"
        )
        print(
            f"    baseline, the agent-down path: {AGENT_DOWN_S} s after the last heartbeat, "
            f"never while degraded heartbeats go on ({AGENT_DOWN_S / took:.0f}x slower at least)"
        )
        took = await hung(stores, args.deadline_s)
        print(
            f"  hung: deadline {args.deadline_s:g} s -> completed elsewhere after {took:.2f} s "
            f"({took - args.deadline_s:.2f} s past the deadline)"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 entries")
    parser.add_argument("--entries", type=int, help="200")
    parser.add_argument("--grace-s", type=float, default=3.0)
    parser.add_argument("--deadline-s", type=float, default=3.0)
    args = parser.parse_args()
    args.entries = args.entries or (50 if args.quick else 200)
    sys.exit(harness.run(main(args)))
