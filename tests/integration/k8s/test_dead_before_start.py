"""A restart must not forget dead pods (reaper rule 3): a pod absent from a successful list and
404 by name is gone whether or not this process saw it, and what any conductor saw is
remembered in PostgreSQL, across a restart and a change of leader.

Real Redis and PostgreSQL, the real kubernetes client, the API stand-in. The agent keeps its
agent-level heartbeat fresh through its other pods, and nothing is stale: only pod evidence
can free the dead pod's entries.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake, queries
from rig_conductor.domain import AgentId, ConsumerName, PodState
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import cycle, observe
from rig_conductor.reaper.podwatch import PodLiveness
from rig_conductor.settings import Settings

from ..helpers import fill, owners, port, read, register
from .standin import Fault, KubeStandIn

S, G = "rig:dispatch", "workers"
PODS = [f"dev-e-rig-agent-runtime-{n}" for n in range(3)]
DEAD = PODS[2]
LABELS = {"app.kubernetes.io/name": "rig-agent-runtime"}


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S,),
        agent_ids=("dev-e",),
        entry_stale_ms=3_600_000,
        agent_down_ms=600_000,
        k8s_namespace="agents",
        k8s_label_selector="app.kubernetes.io/name=rig-agent-runtime",
    )


def liveness(api: client.ApiClient, settings: Settings, engine: AsyncEngine) -> PodLiveness:
    """A conductor's pod evidence, as a freshly started process (or a new leader) has it."""
    return PodLiveness(
        api=api,
        namespace=settings.namespace(),
        label_selector=settings.k8s_label_selector,
        timeout=(1.0, 0.5),
        engine=engine,
        tenant=settings.tenant,
    )


async def three_pods(
    redis: Redis, engine: AsyncEngine, kube: KubeStandIn, *, dead_beats: bool = False
) -> list[str]:
    """DEAD holds 4 entries; the two live pods heartbeat by name (and keep dev-e fresh)."""
    ids = await fill(redis, S, G, 4)
    await read(redis, S, G, DEAD, 4)
    for name in PODS[:2]:
        await register(redis, S, G, name)
        kube.add_pod(name, namespace="agents", labels=LABELS)
    named = PODS if dead_beats else PODS[:2]
    beats = [intake.HeartbeatIn(AgentId("dev-e"), ConsumerName(n)) for n in named]
    await intake.record_heartbeats(engine, tenant="default", heartbeats=beats)
    return ids


async def scan(
    redis: Redis, engine: AsyncEngine, settings: Settings, pods: PodLiveness
) -> cycle.ScanReport:
    return await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        pods=await pods.scan(),
        probe=pods.probe,
        effects=port(engine, settings),
    )


async def test_a_pod_gone_before_the_conductor_started_frees_its_entries(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    ids = await three_pods(redis, engine, kube)
    report = await scan(redis, engine, settings, liveness(api, settings, engine))
    assert report.reclaimed == 4 and report.reclaimed_by_reason == {"pod-gone": 4}
    assert set((await owners(redis, S, G)).values()) <= set(PODS[:2])
    assert sorted(await owners(redis, S, G)) == sorted(ids)
    assert kube.count("pod-get") == 1  # the one consumer the list did not explain


async def test_a_consumer_heartbeating_by_name_is_never_absent(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    # An agent outside the cluster: no pod by that name, but its own heartbeats are fresh.
    await three_pods(redis, engine, kube, dead_beats=True)
    report = await scan(redis, engine, settings, liveness(api, settings, engine))
    assert report.reclaimed == 0
    assert set((await owners(redis, S, G)).values()) == {DEAD}


@pytest.mark.parametrize("status", [403, 500])
async def test_a_failed_get_is_unknown_never_absent(
    status: int,
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    await three_pods(redis, engine, kube)
    kube.inject(Fault("pod-get", status=status))
    report = await scan(redis, engine, settings, liveness(api, settings, engine))
    assert report.reclaimed == 0
    assert set((await owners(redis, S, G)).values()) == {DEAD}


async def test_a_failed_list_asks_nothing_by_name(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    await three_pods(redis, engine, kube)
    kube.inject(Fault("pods-list", status=500))
    report = await scan(redis, engine, settings, liveness(api, settings, engine))
    assert report.reclaimed == 0 and kube.count("pod-get") == 0


async def test_what_one_leader_saw_the_next_one_knows(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    # DEAD heartbeats by its own name, so only having been seen as a pod can make it gone.
    await three_pods(redis, engine, kube, dead_beats=True)
    kube.add_pod(DEAD, namespace="agents", labels=LABELS)
    first = liveness(api, settings, engine)
    assert (await scan(redis, engine, settings, first)).reclaimed == 0
    kube.delete(DEAD, namespace="agents")  # dies while the leadership changes hands
    successor = liveness(api, settings, engine)  # a new process: nothing in memory
    report = await scan(redis, engine, settings, successor)
    assert report.reclaimed == 4 and report.reclaimed_by_reason == {"pod-gone": 4}
    assert kube.count("pod-get") == 0  # PostgreSQL knew it: no GET needed
    assert (await successor.probe([ConsumerName(DEAD)])) == {DEAD: PodState.GONE}


async def test_a_scan_with_kubernetes_reads_the_world_once(
    private_redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Moves, gauges, the detector and the consumer clean-up all work from one XINFO pass and
    one evidence query."""
    redis = private_redis  # INFO commandstats counts this test's commands only
    await three_pods(redis, engine, kube)
    evidence_reads: list[object] = []
    load = queries.load_evidence

    async def counted(*args: object, **kwargs: object) -> object:
        evidence_reads.append(kwargs)
        return await load(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(queries, "load_evidence", counted)
    pods = liveness(api, settings, engine)
    await redis.config_resetstat()
    report = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        pods=await pods.scan(),
        probe=pods.probe,
        hygiene=True,
        metrics=Metrics(),
        detector=observe.Detector(),
        effects=port(engine, settings, metrics=Metrics()),
    )
    assert report.reclaimed == 4
    stats = await redis.info("commandstats")
    # XINFO GROUPS and XINFO CONSUMERS once each (Redis 7 counts them apart, 6.2 together).
    xinfo = sum(v["calls"] for k, v in stats.items() if k.startswith("cmdstat_xinfo"))
    assert xinfo == 2
    assert len(evidence_reads) == 1
