"""Time to recover: a consumer's pod is deleted -> its entries are owned by a live consumer.

The real conductor app (pod evidence, the pod watch, the Lease elector) runs against the
local Kubernetes API stand-in of the test suite, real Redis and PostgreSQL. The owner's agent
keeps heartbeating through its other pod, so neither the heartbeat timeout nor staleness can
free the entries: only the pod evidence can, and the scheduled scan is an hour away. Without
the watch, the same deletion waits for the next scan: up to RIG_SCAN_INTERVAL_S (60 s).

    .venv/bin/python bench/recover.py [--entries 10000] [--runs 5]

Servers: RIG_BENCH_REDIS_URL and RIG_BENCH_DATABASE_URL when set, else embedded ones.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from pathlib import Path

from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.integration.k8s.standin import KubeStandIn

from reclaim import servers
from rig_conductor.adapters import kubernetes, redis_streams
from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import queries
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.settings import Settings

STREAM, GROUP = "bench:recover", "agents"
OWNER, PEER = "dev-e-rig-agent-runtime-0", "dev-e-rig-agent-runtime-1"
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


async def prepare(redis: Redis, settings: Settings, entries: int) -> None:
    await redis.flushdb()
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    for start in range(0, entries, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(entries, start + 5_000)):
                pipe.xadd(STREAM, {"issueId": f"rc-{i}"})
            await pipe.execute()
    await redis.xreadgroup(GROUP, OWNER, {STREAM: ">"}, count=entries)
    await redis.xgroup_createconsumer(STREAM, GROUP, PEER)
    engine = pg_engine.create_engine(settings.sqlalchemy_url, pool_size=1)
    try:
        beats = [queries.HeartbeatIn(AgentId("dev-e"), ConsumerName(c)) for c in (OWNER, PEER)]
        await queries.record_heartbeats(engine, tenant=settings.tenant, heartbeats=beats)
    finally:
        await engine.dispose()


async def owned_by_peer(redis: Redis) -> bool:
    summary = await redis.xpending(STREAM, GROUP)
    holders = {c["name"]: c["pending"] for c in summary["consumers"]}
    return set(holders) == {PEER}


async def recover_once(settings: Settings, entries: int) -> float:
    with KubeStandIn() as kube:
        for name in (OWNER, PEER):
            kube.add_pod(name, namespace="agents", labels=LABELS)
        api = kubernetes.api_client(configuration=kubernetes.client.Configuration(host=kube.url))
        redis = redis_streams.connect(settings.redis_url)
        try:
            await prepare(redis, settings, entries)
            app = create_app(settings, kube=api)
            async with app.router.lifespan_context(app):
                # Polling state outside this process: the stand-in, then Redis.
                while kube.open_watches() == 0:  # noqa: ASYNC110 - elected, watching
                    await asyncio.sleep(0.01)
                deleted = time.perf_counter()
                kube.delete(OWNER, namespace="agents")
                while not await owned_by_peer(redis):  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                return time.perf_counter() - deleted
        finally:
            await redis.aclose()
            api.close()


async def run(args: argparse.Namespace) -> int:
    with servers() as found:
        base = Settings(
            redis_url=found.redis_url,
            database_url=found.database_url,
            streams=(STREAM,),
            agent_ids=("dev-e",),
            entry_stale_ms=3_600_000,
            agent_down_ms=600_000,
            k8s_namespace="agents",
            k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
        )
        settings = base.model_copy(update={"startup_delay_s": 3600.0})
        print("rig-conductor time to recover (pod deleted -> entries owned by a live consumer)")
        print(f"  {args.entries:,} entries held by the deleted pod's consumer; {args.runs} runs")
        times = [await recover_once(settings, args.entries) for _ in range(args.runs)]
        median, worst = statistics.median(times), max(times)
        print(f"  watch (DELETED event -> scan): median {median:.3f} s, worst {worst:.3f} s")
        print(f"  schedule alone would wait for the next scan: up to {base.scan_interval_s:.0f} s")
        verdict = "met" if worst <= 10.0 else "MISSED"
        print(f"  goal: within 10 s of the deletion: {verdict}")
        print("  for scale: the source design takes up to ~11 min; BullMQ ~30-90 s;")
        print("  asynq ~60-120 s; Kafka's default session timeout 45 s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
