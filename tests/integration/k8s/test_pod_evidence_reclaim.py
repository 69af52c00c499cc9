"""Pod evidence through a real scan: a gone pod frees its entries, a failed pod list frees none.

Real Redis and PostgreSQL, the real kubernetes client, the API stand-in. The owner's agent
heartbeats fresh and its entries are far from stale, so only pod evidence can move them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.domain import AgentId, ConsumerName, Pods, PodState
from rig_conductor.reaper import cycle
from rig_conductor.reaper.podwatch import PodLiveness
from rig_conductor.settings import Settings

from ..helpers import fill, owners, port, read, register
from .standin import Fault, KubeStandIn

S, G = "rig:dispatch", "workers"
OWNER = "dev-e-rig-agent-runtime-0"
PEER = "dev-e-rig-agent-runtime-1"
LAPTOP = "dev-e-laptop"  # an agent outside the cluster: never a pod, so its pod is UNKNOWN
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S,),
        agent_ids=("dev-e",),
        entry_stale_ms=3_600_000,  # nothing is stale: only a gone pod can free entries
        agent_down_ms=600_000,
        k8s_namespace="agents",
        k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
    )


async def scene(
    redis: Redis, engine: AsyncEngine, kube: KubeStandIn, pods: PodLiveness
) -> list[str]:
    """OWNER holds 3 fresh entries; everyone heartbeats; the scan has seen both pods."""
    ids = await fill(redis, S, G, 3)
    await read(redis, S, G, OWNER, 3)
    await register(redis, S, G, PEER)
    await register(redis, S, G, LAPTOP)
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[
            intake.HeartbeatIn(AgentId("dev-e"), ConsumerName(name))
            for name in (OWNER, PEER, LAPTOP)
        ],
    )
    for name in (OWNER, PEER):
        kube.add_pod(name, namespace="agents", labels=LABELS)
    assert dict((await pods.scan()).states) == {OWNER: PodState.LIVE, PEER: PodState.LIVE}
    return ids


def pod_liveness(api: client.ApiClient, settings: Settings) -> PodLiveness:
    return PodLiveness(
        api=api,
        namespace=settings.namespace(),
        label_selector=settings.k8s_label_selector,
        timeout=(1.0, 0.5),
    )


async def test_a_gone_pod_frees_its_entries_at_once(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    pods = pod_liveness(api, settings)
    ids = await scene(redis, engine, kube, pods)
    live = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        pods=Pods(pods.tracker.states()),
        effects=port(engine, settings),
    )
    assert live.reclaimed == 0

    kube.delete(OWNER, namespace="agents")
    report = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        pods=await pods.scan(),
        effects=port(engine, settings),
    )

    assert report.reclaimed == 3
    moved = await owners(redis, S, G)
    assert set(moved) == set(ids)
    # Spread over the two live consumers of the group (rule 5).
    assert sorted(moved.values()) == sorted([LAPTOP, LAPTOP, PEER])


@pytest.mark.parametrize(
    "fault",
    [
        Fault("pods-list", status=403),
        Fault("pods-list", status=500),
        Fault("pods-list", delay=1.5),
    ],
    ids=["forbidden", "server-error", "timeout"],
)
async def test_a_failed_pod_list_reclaims_nothing(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
    fault: Fault,
) -> None:
    pods = pod_liveness(api, settings)
    ids = await scene(redis, engine, kube, pods)
    kube.delete(OWNER, namespace="agents")
    kube.inject(fault)

    evidence = await pods.scan()
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, pods=evidence, effects=port(engine, settings)
    )

    assert evidence == Pods()
    assert (report.reclaimed, report.consumers_down, report.no_target) == (0, 0, 0)
    assert await owners(redis, S, G) == dict.fromkeys(ids, OWNER)
