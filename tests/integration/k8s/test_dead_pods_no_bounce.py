"""Two dead pods of a live agent must not trade its entries (reaper rules 3 and 5).

The conductor app with its scheduled reaper, the real kubernetes client and the API stand-in,
real Redis and PostgreSQL. Both pods are deleted (404 by name); the agent keeps heartbeating by
its id through other pods; one dead pod holds two entries, the other has an idle time of its own
from registering. The pod list fails for a while, then recovers. Before rule 5 took the
reaper's own moves and pods missing from the list into account, the entries bounced between the
two dead consumers on every scan, for ever.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId
from rig_conductor.settings import Settings

from ..helpers import fill, owners, read, register, wait_for
from .standin import Fault, KubeStandIn

S, G = "rig:dispatch", "workers"
DEAD_A, DEAD_B, LIVE = (f"dev-e-rig-agent-runtime-{n}" for n in range(3))
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[None]:
    async with app.router.lifespan_context(app):
        yield


def sample(app: FastAPI, name: str, labels: dict[str, str] | None = None) -> float:
    value = app.state.metrics.registry.get_sample_value(name, labels or {})
    return float(value or 0)


def moved(app: FastAPI) -> float:
    """Every entry the app's scans reclaimed, whatever the labels."""
    registry = app.state.metrics.registry
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == "rig_reclaimed_entries"
        for s in metric.samples
        if s.name == "rig_reclaimed_entries_total"
    )


async def test_two_dead_pods_do_not_trade_entries_after_the_api_recovers(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(
        streams=(S,),
        agent_ids=("dev-e",),
        entry_stale_ms=0,
        agent_down_ms=600_000,
        scan_interval_s=0.2,
        startup_delay_s=0,
        k8s_namespace="agents",
        k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
    )
    ids = await fill(redis, S, G, 2)
    await read(redis, S, G, DEAD_A, 2)
    await register(redis, S, G, DEAD_B)
    await intake.record_heartbeats(
        engine, tenant="default", heartbeats=[intake.HeartbeatIn(AgentId("dev-e"))]
    )
    kube.inject(Fault("pods-list", status=500, times=5))
    app = create_app(settings, kube=api)
    async with running(app):
        # The list fails, then works: wait for ten scans after it recovered.
        await wait_for(lambda: kube.count("pods-list") >= 5, within=30)
        recovered = sample(app, "rig_reaper_scans_total", {"outcome": "ok"})
        await wait_for(
            lambda: sample(app, "rig_reaper_scans_total", {"outcome": "ok"}) >= recovered + 10,
            within=30,
        )
        # DEAD_A is gone (404), but DEAD_B is missing from the list and never heartbeated by
        # its own name: no target. The entries stay put and are counted as such.
        assert moved(app) == 0
        assert await owners(redis, S, G) == dict.fromkeys(ids, DEAD_A)
        assert sample(app, "rig_reclaim_no_target_total", {"stream": S, "group": G}) >= 2

        # A live pod appears: the entries go there, once, and stay.
        await register(redis, S, G, LIVE)
        kube.add_pod(LIVE, namespace="agents", labels=LABELS)

        async def at_live() -> bool:
            return await owners(redis, S, G) == dict.fromkeys(ids, LIVE)

        await wait_for(at_live, within=30)
        settled = sample(app, "rig_reaper_scans_total", {"outcome": "ok"})
        await wait_for(
            lambda: sample(app, "rig_reaper_scans_total", {"outcome": "ok"}) >= settled + 10,
            within=30,
        )
        assert moved(app) == 2
        assert await owners(redis, S, G) == dict.fromkeys(ids, LIVE)
