"""Time to recover: how long stuck work waits before another consumer has it (`rig-conductor
serve` as a subprocess) when the owner's pod is deleted, when it is degraded, when it hangs.

    .venv/bin/python bench/recover.py [--quick] [--entries 10000] [--runs 5] [--grace-s 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

import harness
from harness import GROUP, TENANT, BenchError, Stores
from rig_conductor.agent import Entry, run_agent
from rig_conductor.agent.settings import AgentSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.k8s.standin import KubeStandIn

STREAM = "bench:recover"
OWNER, *PEERS = (f"dev-e-rig-agent-runtime-{n}" for n in range(3))
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}
SCAN_S, SCAN_INTERVAL_S, AGENT_DOWN_S = 0.5, 60, 600  # ours; the defaults
CONDUCTOR = {"streams": STREAM, "agent_ids": "dev-e", "tenant": TENANT}
SCANS = {"scan_interval_s": SCAN_S, "startup_delay_s": 0}  # the degraded and hung cases


async def fill(stores: Stores, entries: int) -> None:
    await stores.reset()
    await stores.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    await harness.add_entries(stores.redis, STREAM, entries)
    await harness.deliver(stores.redis, STREAM, [(OWNER, entries)])


async def held_by(stores: Stores, consumers: set[str], since: float, within: float = 30) -> float:
    """Seconds from `since` until the pending entries are held by `consumers` only (none: all
    acked); `within` seconds at most."""
    while time.perf_counter() - since < within:
        summary = await stores.redis.xpending(STREAM, GROUP)
        if {c["name"] for c in summary["consumers"] or ()} == consumers:
            return time.perf_counter() - since
        await asyncio.sleep(0.005)
    raise BenchError(f"stuck entries not recovered {within:g} s later: {summary}")


def conductor(stores: Stores, **settings: object) -> dict[str, str]:
    return harness.conductor_env(stores.servers, **CONDUCTOR, **settings)


async def pod_deleted(stores: Stores, entries: int) -> float:
    await fill(stores, entries)
    await stores.redis.xgroup_createconsumer(STREAM, GROUP, PEERS[0])
    await harness.heartbeat(stores.engine, [("dev-e", OWNER), ("dev-e", PEERS[0])])
    with KubeStandIn() as kube, tempfile.TemporaryDirectory(prefix="rig-bench-") as tmp:
        for name in (OWNER, PEERS[0]):
            kube.add_pod(name, namespace="agents", labels=LABELS)
        config = {"clusters": [{"name": "k", "cluster": {"server": kube.url}}]}
        config |= {"users": [{"name": "u", "user": {"token": "bench"}}], "current-context": "k"}
        config |= {"contexts": [{"name": "k", "context": {"cluster": "k", "user": "u"}}]}
        (Path(tmp) / "kubeconfig").write_text(json.dumps(config))  # JSON is YAML
        selector = "app.kubernetes.io/name=rig-agent-runtime"
        k8s = {"k8s_enabled": "true", "k8s_namespace": "agents", "k8s_label_selector": selector}
        env = conductor(stores, entry_stale_ms=3_600_000, **k8s)
        env["KUBECONFIG"] = f"{tmp}/kubeconfig"
        with harness.serve(env):
            while kube.open_watches() == 0:  # noqa: ASYNC110 - state in the stand-in
                await asyncio.sleep(0.01)
            deleted = time.perf_counter()
            kube.delete(OWNER, namespace="agents")
            return await held_by(stores, {PEERS[0]}, deleted)


@contextlib.asynccontextmanager
async def agents(
    url: str, stores: Stores, handlers: Mapping[str, Callable[[Entry], Any]], deadline_s: float
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
    options = {"agent_id": "dev-e", "group": GROUP, "settings": settings, "stop": stop}
    options |= {"shutdown_grace_s": 0.5, "block_ms": 100}
    runs = [run_agent(handler, consumer=name, **options) for name, handler in handlers.items()]
    tasks = [asyncio.create_task(run) for run in runs]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def done(entry: Entry) -> None:
    time.sleep(0.001)


HEALTHY = dict.fromkeys(PEERS, done)  # the peers' handlers: every entry done in 1 ms


async def degraded(stores: Stores, entries: int, grace_s: float) -> float:
    await fill(stores, entries)
    beat = {"type": "HEARTBEAT", "agentId": "dev-e", "consumer": OWNER}
    beat |= {"degraded": True, "degradedReasons": ["quota"]}
    with harness.serve(conductor(stores, degraded_grace_ms=round(grace_s * 1000), **SCANS)) as url:
        async with agents(url, stores, HEALTHY, 3600), httpx.AsyncClient() as api:
            started = time.perf_counter()
            waiting = asyncio.create_task(held_by(stores, set(), started, grace_s + 30))
            while not waiting.done():
                if (await api.post(f"{url}/api/events", json=beat)).status_code != 202:
                    raise BenchError("the degraded heartbeat was not accepted")
                await asyncio.wait({waiting}, timeout=0.25)
            return waiting.result()


async def hung(stores: Stores, deadline_s: float) -> float:
    release, hanging = threading.Event(), threading.Event()

    def stuck(entry: Entry) -> None:
        hanging.set()
        release.wait(60)

    await fill(stores, 0)
    await stores.redis.xadd(STREAM, {"issueId": "rc-hung"})
    env = conductor(stores, entry_deadline_ms=round(deadline_s * 1000), **SCANS)
    try:
        with harness.serve(env) as url:
            async with agents(url, stores, {OWNER: stuck}, deadline_s):
                while not hanging.is_set():  # noqa: ASYNC110 - set from the handler's thread
                    await asyncio.sleep(0.005)
                started = time.perf_counter()
                async with agents(url, stores, HEALTHY, deadline_s):
                    return await held_by(stores, set(), started, deadline_s + 30)
    finally:
        release.set()


async def main(args: argparse.Namespace) -> int:
    title = "rig-conductor time to recover stuck work; serve as a subprocess"
    async with harness.stores(title) as stores:
        times = [await pod_deleted(stores, args.entries) for _ in range(args.runs)]
        worst = max(times)
        print(
            f"  pod deleted, {args.entries:,} entries: median {harness.median(times):.3f} s, "
            f"worst {worst:.3f} s of {args.runs}; baseline, the schedule alone: the next scan, "
            f"up to {SCAN_INTERVAL_S} s"
        )
        harness.goal("pod deleted, worst", worst, "<=", 10, " s")
        took = await degraded(stores, args.degraded_entries, args.grace_s)
        print(
            f"  degraded, {args.degraded_entries} entries, grace {args.grace_s:g} s: all completed "
            f"elsewhere after {took:.2f} s ({took - args.grace_s:.2f} s past the grace); "
            f"baseline, the agent-down path: {AGENT_DOWN_S} s after the last heartbeat, never "
            f"while degraded heartbeats go on ({AGENT_DOWN_S / took:.0f}x slower at least)"
        )
        took = await hung(stores, args.deadline_s)
        print(
            f"  hung, deadline {args.deadline_s:g} s: completed elsewhere after {took:.2f} s "
            f"({took - args.deadline_s:.2f} s past the deadline)"
        )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 entries, 2 runs; 50 degraded")
    parser.add_argument("--entries", type=int, help="held by the deleted pod (10,000)")
    parser.add_argument("--runs", type=int, help="pod deletions (5)")
    parser.add_argument("--degraded-entries", type=int, help="held by the degraded owner (200)")
    parser.add_argument("--grace-s", type=float, default=3.0, help="RIG_DEGRADED_GRACE_MS")
    parser.add_argument("--deadline-s", type=float, default=3.0, help="RIG_ENTRY_DEADLINE_MS")
    args = harness.options(parser, entries=(10_000, 1_000), runs=(5, 2), degraded_entries=(200, 50))
    sys.exit(harness.run(main(args)))
