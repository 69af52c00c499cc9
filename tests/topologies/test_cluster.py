"""The reaper, dead letters and dispatch on a real Redis Cluster of 3 primaries and 3 replicas."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from redis.asyncio import RedisCluster
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.adapters.redis.client import Topology
from rig_conductor.app import create_app
from rig_conductor.domain import AgentId, ConsumerName, Pods, StreamKey
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings
from tests.integration.console_kit import OPERATOR, client_of, sign_in
from tests.integration.helpers import fill, idle_at_least, owners, port, read, register

from .servers import Cluster

STREAMS = [f"assignments:{n}" for n in range(9)]
G = "workers"
DEAD, LIVE = "dead-pod-0", "live-pod-0"
STALE_MS = 100
PER_STREAM = 5


async def scene(
    client: RedisCluster, engine: AsyncEngine, streams: list[str]
) -> dict[str, list[str]]:
    """On every stream, `DEAD` holds PER_STREAM entries and `LIVE` (heartbeating) holds none."""
    held = {}
    for stream in streams:
        await fill(client, stream, G, PER_STREAM)
        held[stream] = await read(client, stream, G, DEAD, PER_STREAM)
        await register(client, stream, G, LIVE)
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("live"), ConsumerName(LIVE))],
    )
    for stream in streams:
        await idle_at_least(client, stream, G, STALE_MS)
    return held


def reaper_settings(
    settings_for: Callable[..., Settings], env: dict[str, str], **extra: Any
) -> Settings:
    values: dict[str, Any] = {
        "streams": ("assignments:*",),
        "agent_ids": ("dead", "live"),
        "entry_stale_ms": STALE_MS,
        "agent_down_ms": 60_000,
    }
    return settings_for(env, **{**values, **extra})


async def test_streams_on_every_primary_are_found_and_reclaimed(
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
) -> None:
    await cluster_client.initialize()
    nodes = {cluster_client.get_node_from_key(stream).name for stream in STREAMS}
    assert len(nodes) == 3, "the streams must spread over every primary"
    held = await scene(cluster_client, engine, STREAMS)
    settings = reaper_settings(settings_for, cluster_env)
    topology = Topology(cluster_client, settings)
    try:
        report = await cycle.reap_once(
            redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
        )
    finally:
        await topology.aclose()
    assert (report.streams, report.groups, report.reclaimed) == (9, 9, 9 * PER_STREAM)
    assert report.nodes_failed == [] and report.no_target == 0
    for stream in STREAMS:
        assert await owners(cluster_client, stream, G) == dict.fromkeys(held[stream], LIVE)


async def test_groups_on_different_primaries_are_judged_on_heartbeats_of_their_own(
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
) -> None:
    """Groups on every primary, judged side by side, each with its own target alive by its own
    heartbeat only (every pod missing from a successful list: rule 5, docs/rules.md): each
    group reads that heartbeat for itself, and every entry goes to its own group's target."""
    await cluster_client.initialize()
    targets = {stream: f"live-pod-{n}" for n, stream in enumerate(STREAMS)}
    held = {}
    for stream, target in targets.items():
        await fill(cluster_client, stream, G, PER_STREAM)
        held[stream] = await read(cluster_client, stream, G, DEAD, PER_STREAM)
        await register(cluster_client, stream, G, target)
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("live"), ConsumerName(t)) for t in targets.values()],
    )
    for stream in targets:
        await idle_at_least(cluster_client, stream, G, STALE_MS)
    settings = reaper_settings(settings_for, cluster_env)
    topology = Topology(cluster_client, settings)
    try:
        report = await cycle.reap_once(
            redis=topology,
            engine=engine,
            settings=settings,
            pods=Pods({}, listed=True),
            effects=port(engine, settings),
        )
    finally:
        await topology.aclose()
    assert (report.reclaimed, report.no_target) == (9 * PER_STREAM, 0)
    for stream, target in targets.items():
        assert await owners(cluster_client, stream, G) == dict.fromkeys(held[stream], target)


async def test_dead_letters_go_to_a_stream_in_the_same_slot_and_requeue_there(
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
) -> None:
    held = await scene(cluster_client, engine, STREAMS[:3])
    settings = reaper_settings(settings_for, cluster_env, max_deliveries=1)
    topology = Topology(cluster_client, settings)
    try:
        report = await cycle.reap_once(
            redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
        )
    finally:
        await topology.aclose()
    assert report.dead_lettered == 3 * PER_STREAM and report.reclaimed == 0
    for stream in STREAMS[:3]:
        dlq = redis_keys.dlq_key(stream, clustered=True)
        assert dlq == "{" + stream + "}:dlq"
        assert cluster_client.keyslot(dlq) == cluster_client.keyslot(stream)
        letters = await redis_streams.list_dead_letters(
            cluster_client, stream=StreamKey(stream), count=100
        )
        assert sorted(letter.original_id for letter in letters) == sorted(held[stream])
        assert await owners(cluster_client, stream, G) == {}
        back = await redis_writes.requeue(
            cluster_client, stream=StreamKey(stream), dlq_id=letters[0].dlq_id
        )
        assert back is not None
        assert len(await cluster_client.xrange(dlq)) == PER_STREAM - 1


async def test_dispatch_is_appended_once_per_key_beside_its_marker(
    cluster_client: RedisCluster,
) -> None:
    stream = StreamKey("rig:dispatch")
    fields = {"type": "ISSUE_ASSIGNED", "issueId": "rc-1"}
    first = await redis_writes.append_once(
        cluster_client, stream=stream, key="rc-1", fields=fields, remember_s=60
    )
    again = await redis_writes.append_once(
        cluster_client, stream=stream, key="rc-1", fields=fields, remember_s=60
    )
    assert first[1] and not again[1] and first[0] == again[0]
    assert await cluster_client.xlen(stream) == 1
    marker = redis_keys.dispatched_key(stream, "rc-1", clustered=True)
    assert await cluster_client.get(marker) == first[0]


async def test_a_slot_moved_since_the_map_was_read_costs_one_retry_and_no_double_move(
    cluster: Cluster,
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
) -> None:
    stream = STREAMS[0]
    held = await scene(cluster_client, engine, [stream])
    settings = reaper_settings(settings_for, cluster_env, streams=(stream,))
    topology = Topology(cluster_client, settings)
    try:
        before = topology.owner(stream)
        await topology.nodes()  # the slot map is read now ...
        target = next(p for p in cluster.primaries() if p != cluster.port_of(before))
        cluster.migrate_slot(stream, target)  # ... and is stale from here on
        assert topology.owner(stream) == before
        report = await cycle.reap_once(
            redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
        )
    finally:
        await topology.aclose()
    assert report.reclaimed == PER_STREAM and report.nodes_failed == []
    assert cluster.owner_of(stream) == target
    assert await owners(cluster_client, stream, G) == dict.fromkeys(held[stream], LIVE)
    async with engine.connect() as conn:
        moved = await conn.scalar(
            select(func.sum(func.cardinality(events.c.entry_ids))).where(
                events.c.kind == "RECLAIMED"
            )
        )
    assert moved == PER_STREAM  # recorded once each


@pytest.mark.parametrize("seam", ["read_pages", "claim"])
async def test_a_slot_moved_under_the_sweep_is_retried_where_it_lives_now(
    seam: str,
    cluster: Cluster,
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The slot moves after the scan read the group and before the sweep reads its pending
    list (`read_pages`) or claims from it (`claim`): Redis answers that pipeline's commands
    MOVED. That reply is raised (`raise_moved`), so `on_owner` re-reads the slot map and sweeps
    again on the new primary; it must not be logged as a page skipped or a claim failed, with
    nothing moved. The slot is moved from inside the adapter's own function, the one moment
    between the reading and the sweep a test can reach; the MOVED itself is the real server's."""
    stream = STREAMS[1]
    held = await scene(cluster_client, engine, [stream])
    settings = reaper_settings(settings_for, cluster_env, streams=(stream,))
    topology = Topology(cluster_client, settings)
    module = {"read_pages": redis_sweep, "claim": redis_writes}[seam]  # the reads; the writes
    real = getattr(module, seam)
    calls = 0

    async def slot_moves_first(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            source = cluster.owner_of(stream)
            cluster.migrate_slot(stream, next(p for p in cluster.primaries() if p != source))
        return await real(*args, **kwargs)

    try:
        before = cluster.owner_of(stream)
        with (
            mock.patch.object(module, seam, slot_moves_first),
            caplog.at_level(logging.INFO, logger="rig_conductor"),
        ):
            report = await cycle.reap_once(
                redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
            )
    finally:
        await topology.aclose()
    assert cluster.owner_of(stream) != before, "the slot moved under the sweep"
    assert calls >= 2, "the sweep ran again after the MOVED"
    skipped = [r.getMessage() for r in caplog.records if r.name == redis_sweep.__name__]
    assert skipped == [], "a MOVED reply read as a page skipped or a claim failed"
    assert not [r for r in caplog.records if "[StreamReclaim] Left" in r.getMessage()]
    assert report.reclaimed == PER_STREAM and report.nodes_failed == []
    assert await owners(cluster_client, stream, G) == dict.fromkeys(held[stream], LIVE)


async def test_a_dead_primary_is_left_out_and_counted_while_the_others_are_reaped(
    cluster: Cluster,
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
) -> None:
    held = await scene(cluster_client, engine, STREAMS)
    settings = reaper_settings(settings_for, cluster_env)
    topology = Topology(cluster_client, settings)
    await topology.nodes()
    victim = cluster.owner_of(STREAMS[0])
    on_victim = [s for s in STREAMS if cluster.owner_of(s) == victim]
    cluster.server(victim).kill()
    try:
        with caplog.at_level(logging.WARNING, logger="rig_conductor"):
            report = await cycle.reap_once(
                redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
            )
        assert report.nodes_failed == [f"127.0.0.1:{victim}"]
        assert report.reclaimed == (len(STREAMS) - len(on_victim)) * PER_STREAM
        assert any("left out of this scan" in r.getMessage() for r in caplog.records)
        # The replica takes over; the next scan reaches the streams the dead node held.
        cluster.wait_failover(victim)
        report = await cycle.reap_once(
            redis=topology, engine=engine, settings=settings, effects=port(engine, settings)
        )
        assert report.nodes_failed == []
        assert report.reclaimed == len(on_victim) * PER_STREAM
        for stream in STREAMS:
            assert await owners(cluster_client, stream, G) == dict.fromkeys(held[stream], LIVE)
    finally:
        await topology.aclose()
        cluster.restart(victim)


async def test_a_stream_name_no_dead_letter_can_share_a_slot_with_answers_4xx(
    cluster_client: RedisCluster,
    cluster_env: dict[str, str],
    engine: AsyncEngine,
    settings_for: Callable[..., Settings],
) -> None:
    """`a}b` hashes only up to its `}` in a companion key: no DLQ can live beside it."""
    await fill(cluster_client, "assignments:a}b", G, 1)
    settings = reaper_settings(settings_for, cluster_env, operator_tokens=OPERATOR)
    async for api in client_of(create_app(settings, schedule_reaper=False)):
        auth = {"Authorization": f"Bearer {OPERATOR}"}
        # A watched stream (assignments:*), so the view gets as far as its dead letters' key.
        watched = {"stream": "assignments:a}b"}
        listed = await api.get("/api/deadletters", params=watched, headers=auth)
        assert listed.status_code == 422 and "hash tag" in listed.json()["detail"]
        body = {"stream": "a}b", "dlqId": "1-0"}
        requeue = await api.post("/api/deadletters/requeue", json=body, headers=auth)
        assert requeue.status_code == 422 and "hash tag" in requeue.json()["detail"]
        params = {"stream": "a}b", "dlqId": "1-0"}
        assert (
            await api.delete("/api/deadletters", params=params, headers=auth)
        ).status_code == 422
        await sign_in(api, OPERATOR)
        assert (await api.get("/ui")).status_code == 200  # the overview counts its DLQ as empty
        page = await api.get("/ui/deadletters", params={"stream": "assignments:a}b"})
        assert page.status_code == 400 and "hash tag" in page.text
