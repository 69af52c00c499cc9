"""Consumer hygiene end to end: only empty consumers of gone pods with stale heartbeats go."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake, queries
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import AgentId, ConsumerName, GroupName, Pods, StreamKey
from rig_conductor.effects import port
from rig_conductor.effects.hygiene import delete_consumers
from rig_conductor.policy.hygiene import ConsumerRemoval
from rig_conductor.reaper.cleanup import remove_consumers
from rig_conductor.reaper.podwatch import PodLiveness
from rig_conductor.settings import Settings

from ..helpers import fill, read, register
from .standin import Fault, KubeStandIn

S, G = "rig:dispatch", "workers"
DOWN_MS = 1500  # long enough for a scan and a sweep on a loaded machine
LABELS = {"app": "rig-agent"}
SCALED_DOWN = "dev-e-rig-agent-runtime-2"  # the one consumer that must go
HOLDS_WORK = "dev-e-rig-agent-runtime-3"
RUNNING = "dev-e-rig-agent-runtime-0"
JUST_HEARTBEATED = "dev-e-rig-agent-runtime-4"
OUTSIDE = "dev-e-laptop"  # never a pod


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(streams=(S,), agent_ids=("dev-e",), agent_down_ms=DOWN_MS)


async def beat(engine: AsyncEngine, *consumers: str) -> None:
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("dev-e"), ConsumerName(c)) for c in consumers],
    )


async def sweep(
    redis: Redis,
    engine: AsyncEngine,
    settings: Settings,
    pods: Pods,
    dry_run: bool = False,
) -> list[ConsumerRemoval]:
    """The clean-up as a scan runs it: on the scan's reading of the groups and evidence."""
    groups = await redis_streams.describe_groups(redis, streams=[StreamKey(S)])
    evidence = await queries.load_evidence(
        engine, tenant="default", configured_agents=settings.agent_ids, down_ms=60_000, pods=pods
    )
    return await remove_consumers(
        redis=redis,
        groups=groups,
        evidence=evidence,
        limits=settings.limits,
        effects=port.choose(dry_run, engine=engine, tenant="default"),
    )


async def consumers(redis: Redis) -> set[str]:
    return {row["name"] for row in await redis.xinfo_consumers(S, G)}


async def scene(
    redis: Redis, engine: AsyncEngine, kube: KubeStandIn, api: client.ApiClient
) -> PodLiveness:
    await fill(redis, S, G, 2)
    for name in (SCALED_DOWN, RUNNING, JUST_HEARTBEATED, OUTSIDE):
        await register(redis, S, G, name)
    await read(redis, S, G, HOLDS_WORK, 1)
    for name in (SCALED_DOWN, HOLDS_WORK, RUNNING, JUST_HEARTBEATED):
        kube.add_pod(name, labels=LABELS)
    pods = PodLiveness(api=api, namespace="default", label_selector="app=rig-agent")
    await pods.scan()
    await beat(engine, SCALED_DOWN, HOLDS_WORK, OUTSIDE)
    for name in (SCALED_DOWN, HOLDS_WORK, JUST_HEARTBEATED):
        kube.delete(name)
    await asyncio.sleep(DOWN_MS / 1000 + 0.1)  # heartbeats stale, XINFO idle past the limit
    await beat(engine, RUNNING, JUST_HEARTBEATED)  # the agent itself is alive
    return pods


async def test_deletes_only_empty_consumers_of_gone_pods_with_stale_heartbeats(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    pods = await scene(redis, engine, kube, api)
    evidence = await pods.scan()

    planned = await sweep(redis, engine, settings, evidence, dry_run=True)
    assert [r.consumer for r in planned] == [SCALED_DOWN]
    assert SCALED_DOWN in await consumers(redis)

    # The live agent keeps heartbeating: on a loaded machine the dry run alone can outlast
    # RIG_AGENT_DOWN_MS, and a consumer that heartbeats is never swept.
    await beat(engine, RUNNING, JUST_HEARTBEATED)
    deleted = await sweep(redis, engine, settings, evidence)
    assert [r.consumer for r in deleted] == [SCALED_DOWN]
    assert await consumers(redis) == {HOLDS_WORK, RUNNING, JUST_HEARTBEATED, OUTSIDE}


async def test_a_failed_pod_list_deletes_nothing(
    redis: Redis,
    engine: AsyncEngine,
    kube: KubeStandIn,
    api: client.ApiClient,
    settings: Settings,
) -> None:
    pods = await scene(redis, engine, kube, api)
    kube.inject(Fault("pods-list", status=403))
    evidence = await pods.scan()
    assert evidence == Pods()
    assert await sweep(redis, engine, settings, evidence) == []
    assert SCALED_DOWN in await consumers(redis)


def removal(consumer: str, stream: str = S, group: str = G) -> ConsumerRemoval:
    return ConsumerRemoval(StreamKey(stream), GroupName(group), ConsumerName(consumer), None, 0)


async def test_the_guard_refuses_a_consumer_that_received_an_entry_meanwhile(
    any_redis: Redis,
) -> None:
    """Planned while empty; an entry is claimed to it before the delete: it stays, with it."""
    ids = await fill(any_redis, S, G, 1)
    await read(any_redis, S, G, "owner-0", 1)
    await register(any_redis, S, G, "empty-0")
    await register(any_redis, S, G, "late-0")
    plan = [removal("empty-0"), removal("late-0")]

    await any_redis.xclaim(S, G, "late-0", min_idle_time=0, message_ids=ids, justid=True)
    deleted = await delete_consumers(any_redis, removals=plan)

    assert [r.consumer for r in deleted] == ["empty-0"]
    rows = {row["name"]: row["pending"] for row in await any_redis.xinfo_consumers(S, G)}
    assert rows == {"owner-0": 0, "late-0": 1}


async def test_a_vanished_group_is_skipped(any_redis: Redis) -> None:
    await fill(any_redis, S, G, 0)
    await register(any_redis, S, G, "empty-0")
    plan = [
        removal("x-0", group="gone"),
        removal("x-0", stream="no-such-stream"),
        removal("empty-0"),
    ]
    deleted = await delete_consumers(any_redis, removals=plan)
    assert [r.consumer for r in deleted] == ["empty-0"]
    assert await any_redis.xinfo_consumers(S, G) == []
