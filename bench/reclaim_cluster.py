"""Reclaim on a Redis Cluster of 3 primaries and 3 replicas against the benchmarks' standalone
Redis with the same data: `rig-conductor reap --once` as users run it.

    .venv/bin/python bench/reclaim_cluster.py [--quick] [--entries 300000] [--streams 12]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

import harness
from harness import Stores

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.topologies.servers import Cluster

GROUP, STALE_MS = "workers", 100
DEAD = [f"dead-{n}-pod" for n in range(10)]
LIVE = [(f"live-{n}", f"live-{n}-pod") for n in range(10)]
AGENTS = ",".join([c.removesuffix("-pod") for c in DEAD] + [a for a, _ in LIVE])


def plant(client: Any, streams: list[str], per_stream: int) -> None:
    """Every stream: its group, `per_stream` entries read by the dead consumers, the live ones
    registered. `client` is a standalone or a cluster client (a stream lives on one node)."""
    for stream in streams:
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for start in range(0, per_stream, 10_000):
            pipe = client.pipeline(transaction=False)
            for n in range(start, min(per_stream, start + 10_000)):
                pipe.xadd(stream, {"issueId": f"{stream}-{n}"})
            pipe.execute()
        for consumer in DEAD:
            client.xreadgroup(GROUP, consumer, {stream: ">"}, count=per_stream // len(DEAD) + 1)
        for _, consumer in LIVE:
            client.xgroup_createconsumer(stream, GROUP, consumer)
    time.sleep(STALE_MS / 1000 + 0.05)


async def measure(
    label: str, stores: Stores, client: Any, args: argparse.Namespace, **env: str
) -> float:
    """`reap --once` on a fresh copy of the data set on `client`'s servers: entries/s."""
    await stores.reset()
    per_stream = args.entries // len(args.names)
    await asyncio.to_thread(plant, client, args.names, per_stream)
    await harness.heartbeat(stores.engine, LIVE)
    settings = {"streams": "assignments:*", "agent_ids": AGENTS, "entry_stale_ms": STALE_MS}
    run, report = await harness.run_reap(stores, len(args.names) * per_stream, **settings, **env)
    moved = report["reclaimed"]
    print(f"  {label:<36} {moved / run.seconds:>9,.0f} entries/s  {run.seconds:6.2f} s")
    client.delete(*args.names)
    return moved / run.seconds


async def main(args: argparse.Namespace) -> int:
    title = f"rig-conductor reclaim on a Redis Cluster: reap --once, INFO, {args.entries:,} entries"
    async with harness.stores(f"{title} over {args.streams} streams") as stores:
        standalone = redis.Redis.from_url(stores.servers.redis_url, decode_responses=True)
        base = await measure("standalone (one server, baseline)", stores, standalone, args)
        standalone.close()
        with tempfile.TemporaryDirectory(prefix="rig-bench-") as root:
            cluster = await asyncio.to_thread(Cluster(Path(root)).start)
            try:
                client = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
                on = {client.get_node_from_key(name).name for name in args.names}
                label = f"cluster, 3 primaries ({len(on)} hold streams)"
                cluster_env = {"redis_mode": "cluster", "redis_url": cluster.url}
                rate = await measure(label, stores, client, args, **cluster_env)
                client.close()
            finally:
                cluster.close()
        note = "(one machine runs the conductor and all six nodes)"
        print(f"  cluster / standalone: {rate / base:.2f}x {note}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30,000 entries over 6 streams")
    parser.add_argument("--entries", type=int, help="300,000")
    parser.add_argument("--streams", type=int, help="12")
    args = harness.options(parser, entries=(300_000, 30_000), streams=(12, 6))
    args.names = [f"assignments:{n}" for n in range(args.streams)]
    sys.exit(harness.run(main(args)))
