"""Reclaim on a Redis Cluster of 3 primaries and 3 replicas, next to one standalone server.

    .venv/bin/python bench/reclaim_cluster.py [--entries 300000] [--streams 12]

The same data set on each: `--streams` streams (`assignments:<n>`, spread over every primary
on the cluster), each with 20 consumers, the first half dead (their agents never heartbeat)
and holding every entry, the other half live. The time is `rig-conductor reap --once` as users
run it: a subprocess at INFO, its stderr read through a pipe. The cluster runs on local ports
from Debian's redis-server (tests/topologies/servers.py); the standalone server is the
benchmarks' Redis (RIG_BENCH_REDIS_URL, else embedded). Both are Redis 7 when configured.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from common import BenchError
from reclaim import servers
from reclaim_cli import run_reap_once
from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import queries
from rig_conductor.domain import AgentId, ConsumerName

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.topologies.servers import Cluster

GROUP, CONSUMERS, TENANT = "workers", 20, "bench-cluster"
STALE_MS, AGENT_DOWN_MS = 100, 600_000
CLUSTER_BASE = 7600


def build(client: Any, streams: list[str], entries: int) -> None:
    """Every stream: its group, `entries // len(streams)` entries read by the dead consumers,
    and the live consumers registered."""
    per_stream = entries // len(streams)
    dead = [f"dead-{n}-pod" for n in range(CONSUMERS // 2)]
    for stream in streams:
        client.delete(stream)
        client.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for start in range(0, per_stream, 10_000):
            pipe = client.pipeline(transaction=False)
            for n in range(start, min(per_stream, start + 10_000)):
                pipe.xadd(stream, {"issueId": f"{stream}-{n}"})
            pipe.execute()
        share = per_stream // len(dead) + 1
        for consumer in dead:
            client.xreadgroup(GROUP, consumer, {stream: ">"}, count=share)
        for n in range(CONSUMERS // 2):
            client.xgroup_createconsumer(stream, GROUP, f"live-{n}-pod")
    time.sleep(STALE_MS / 1000 + 0.05)


async def heartbeat_live(database_url: str) -> None:
    engine = pg_engine.create_engine(database_url)
    try:
        await queries.record_heartbeats(
            engine,
            tenant=TENANT,
            heartbeats=[
                queries.HeartbeatIn(AgentId(f"live-{n}"), ConsumerName(f"live-{n}-pod"))
                for n in range(CONSUMERS // 2)
            ],
        )
    finally:
        await engine.dispose()


def reap_once(env_extra: dict[str, str], database_url: str) -> tuple[float, int, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    agents = [f"dead-{n}" for n in range(CONSUMERS // 2)] + [
        f"live-{n}" for n in range(CONSUMERS // 2)
    ]
    env.update(
        RIG_DATABASE_URL=database_url,
        RIG_STREAMS="assignments:*",
        RIG_AGENT_IDS=",".join(agents),
        RIG_ENTRY_STALE_MS=str(STALE_MS),
        RIG_AGENT_DOWN_MS=str(AGENT_DOWN_MS),
        RIG_TENANT=TENANT,
        RIG_K8S_ENABLED="false",
        **env_extra,
    )
    seconds, report, lines, _ = run_reap_once(env)
    return seconds, int(report["reclaimed"]), lines


def measure(label: str, client: Any, env: dict[str, str], database_url: str, args: Any) -> float:
    streams = [f"assignments:{n}" for n in range(args.streams)]
    build(client, streams, args.entries)
    asyncio.run(heartbeat_live(database_url))
    seconds, moved, lines = reap_once(env, database_url)
    expected = (args.entries // args.streams) * args.streams
    if not moved == lines == expected:
        raise BenchError(f"{label}: moved {moved:,}, {lines:,} lines, expected {expected:,}")
    rate = moved / seconds
    print(f"    {label:<34} {rate:>10,.0f} entries/s  {seconds:6.2f} s")
    for stream in streams:
        client.delete(stream)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--streams", type=int, default=12)
    args = parser.parse_args()
    print(
        f"rig-conductor reclaim on a Redis Cluster: reap --once, INFO, {args.entries:,} entries "
        f"over {args.streams} streams"
    )
    try:
        with servers() as found, tempfile.TemporaryDirectory(prefix="rig-bench-") as root:
            standalone = redis.Redis.from_url(found.redis_url, decode_responses=True)
            base = measure(
                "standalone (one server)",
                standalone,
                {"RIG_REDIS_URL": found.redis_url},
                found.database_url,
                args,
            )
            cluster = Cluster(Path(root), base=CLUSTER_BASE).start()
            try:
                client = redis.RedisCluster.from_url(cluster.url, decode_responses=True)
                spread = {
                    client.get_node_from_key(f"assignments:{n}").name for n in range(args.streams)
                }
                rate = measure(
                    f"cluster, 3 primaries ({len(spread)} hold streams)",
                    client,
                    {"RIG_REDIS_MODE": "cluster", "RIG_REDIS_URL": cluster.url},
                    found.database_url,
                    args,
                )
            finally:
                cluster.close()
            print(
                f"    cluster / standalone: {rate / base:.2f}x "
                "(one 2-core machine runs the conductor and all six nodes)"
            )
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
