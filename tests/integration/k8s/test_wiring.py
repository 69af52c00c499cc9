"""The Kubernetes pieces wired into the conductor app: a deleted pod's entries move through the
watch with no scheduled scan, and of two conductors only one reaps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.settings import Settings

from ..helpers import fill, owners, read, register, wait_for
from .standin import KubeStandIn

S, G = "rig:dispatch", "workers"
OWNER, PEER = "dev-e-rig-agent-runtime-0", "dev-e-rig-agent-runtime-1"
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


@asynccontextmanager
async def running(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as api:
            yield api


def scans(app: FastAPI) -> float:
    value = app.state.metrics.registry.get_sample_value("rig_reaper_scans_total", {"outcome": "ok"})
    return float(value or 0)


async def test_a_deleted_pod_frees_its_entries_through_the_watch(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings(
        streams=(S,),
        agent_ids=("dev-e",),
        entry_stale_ms=3_600_000,
        agent_down_ms=600_000,
        startup_delay_s=3600,
        k8s_namespace="agents",
        k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
    )
    ids = await fill(redis, S, G, 3)
    await read(redis, S, G, OWNER, 3)
    await register(redis, S, G, PEER)
    beats = [intake.HeartbeatIn(AgentId("dev-e"), ConsumerName(c)) for c in (OWNER, PEER)]
    await intake.record_heartbeats(engine, tenant="default", heartbeats=beats)
    for name in (OWNER, PEER):
        kube.add_pod(name, namespace="agents", labels=LABELS)
    app = create_app(settings, kube=api)
    async with running(app):
        await wait_for(lambda: kube.open_watches() > 0, within=10)  # elected, watching
        kube.delete(OWNER, namespace="agents")

        async def moved() -> bool:
            return await owners(redis, S, G) == dict.fromkeys(ids, PEER)

        await wait_for(moved, within=10)
        # The watch triggered the scan (the schedule waits an hour); a scan is counted when it
        # ends, after its moves: wait for that before shutting down.
        await wait_for(lambda: scans(app) >= 1, within=10)
    lease = kube.lease("rig-conductor-reaper", namespace="agents")
    assert lease is not None


async def test_two_conductors_one_reaper(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), scan_interval_s=0.2, startup_delay_s=0)
    first, second = create_app(settings), create_app(settings)
    async with running(first) as api_first:
        await wait_for(lambda: scans(first) >= 2, within=10)
        async with running(second) as api_second:
            await asyncio.sleep(1.0)  # five scan intervals: time for a scan it must not run
            assert scans(second) == 0  # the first holds the lease row
            refused = await api_second.post("/api/reaper/scan")
            assert refused.status_code == 409
            assert (await api_second.post("/api/reaper/scan?dryRun=true")).status_code == 200
            assert (await api_first.post("/api/reaper/scan")).status_code == 200
        # The second stopped; the first still reaps.
        before = scans(first)
        await wait_for(lambda: scans(first) > before, within=10)
    # Now the first is gone too: a new conductor takes over at once.
    third = create_app(settings)
    async with running(third):
        await wait_for(lambda: scans(third) >= 1, within=10)


async def test_the_follower_takes_over_when_the_leader_stops(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), scan_interval_s=0.2, startup_delay_s=0)
    leader_app, follower_app = create_app(settings), create_app(settings)
    follower = running(follower_app)
    async with running(leader_app):
        await wait_for(lambda: scans(leader_app) >= 1, within=10)
        await follower.__aenter__()
        await asyncio.sleep(0.6)  # three scan intervals: time for a scan it must not run
        assert scans(follower_app) == 0
    try:
        await wait_for(lambda: scans(follower_app) >= 1, within=15)
    finally:
        await follower.__aexit__(None, None, None)
