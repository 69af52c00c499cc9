"""One reaper scan end to end: real Redis, real PostgreSQL, the contract's log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres import intake, queries
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import AgentId, ConsumerName, Evidence, Heartbeat, Pods, PodState
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings
from tests import redis_kit

from .helpers import fill, idle_at_least, owners, port, read, register

S, G = "rig:dispatch", "workers"
STALE_MS = 200


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S, "assignments:*"),
        agent_ids=("review-e", "review-e-codex"),
        entry_stale_ms=STALE_MS,
        agent_down_ms=60_000,
    )


async def beat(engine: AsyncEngine, agent: str, consumer: str | None = None) -> None:
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[
            intake.HeartbeatIn(AgentId(agent), ConsumerName(consumer) if consumer else None)
        ],
    )


async def scene(redis: Redis, engine: AsyncEngine, *, held: int = 3) -> list[str]:
    """review-e-codex's consumer holds `held` stale entries; review-e heartbeats and reads."""
    ids = await fill(redis, S, G, held + 1)
    await read(redis, S, G, "review-e-codex-rig-agent-runtime-0", held)
    await register(redis, S, G, "review-e-rig-agent-runtime-0")
    await beat(engine, "review-e", "review-e-rig-agent-runtime-0")
    await idle_at_least(redis, S, G, STALE_MS)
    return ids


async def test_reclaims_stale_entries_of_a_silent_agent(
    redis: Redis, engine: AsyncEngine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await scene(redis, engine)
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        report = await cycle.reap_once(
            redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
        )
    assert (report.streams, report.groups, report.pending, report.reclaimed) == (1, 1, 3, 3)
    assert (report.dead_lettered, report.no_target, report.dry_run) == (0, 0, False)
    assert await owners(redis, S, G) == dict.fromkeys(ids[:3], "review-e-rig-agent-runtime-0")
    lines = [
        line
        for r in caplog.records
        for line in logs.messages(r)
        if line.startswith("[StreamReclaim] Reclaimed")
    ]
    assert lines == [
        f"[StreamReclaim] Reclaimed {i} on rig:dispatch: "
        "review-e-codex-rig-agent-runtime-0 -> review-e-rig-agent-runtime-0"
        for i in ids[:3]
    ]
    async with engine.connect() as conn:
        [row] = (await conn.execute(select(events).where(events.c.kind == "RECLAIMED"))).all()
    # One row per batch moved together, the batch's ids in entry_ids.
    assert sorted(row.entry_ids) == ids[:3]
    assert (row.agent_id, row.consumer, row.stream, row.group_name, row.entry_id) == (
        "review-e-codex",
        "review-e-codex-rig-agent-runtime-0",
        S,
        G,
        None,
    )
    assert row.detail == {
        "toConsumer": "review-e-rig-agent-runtime-0",
        "toAgent": "review-e",
        "reason": "down",
        "reasons": ["agent-never-heartbeated"],
        "lastHeartbeatAt": None,
        "count": 3,
    }


async def test_a_consumer_silent_by_its_own_heartbeat_is_no_target(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    """The scan loads the own heartbeats of the consumers holding entries up front, and the
    others' only in a group where something moves: a consumer whose agent is up but whose own
    heartbeat went stale must still be judged on it, never handed entries."""
    ids = await scene(redis, engine)
    silent = "review-e-rig-agent-runtime-9"
    await register(redis, S, G, silent)
    await beat(engine, "review-e", silent)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE consumer_heartbeats SET last_heartbeat_at = now() - interval '1 hour' "
                "WHERE consumer = :c"
            ),
            {"c": silent},
        )
    await beat(engine, "review-e")  # the agent itself is up
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 3
    assert await owners(redis, S, G) == dict.fromkeys(ids[:3], "review-e-rig-agent-runtime-0")


async def test_groups_judged_on_heartbeats_of_their_own_leave_the_scan_evidence_unchanged(
    redis: Redis, engine: AsyncEngine, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two groups where something moves, each with a target alive by its own heartbeat only
    (every pod missing from a successful list: rule 5, docs/rules.md). The scan reads those
    heartbeats for each group apart: both are judged right, and the evidence the scan began
    with is read-only and ends as it began."""
    built: list[Evidence] = []
    load = cycle.built.load

    async def kept(*args: Any, **kwargs: Any) -> Evidence:
        built.append(await load(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(cycle.built, "load", kept)
    owner, stranger = "review-e-codex-rig-agent-runtime-0", "review-e-rig-agent-runtime-9"
    targets = {
        "assignments:a": "review-e-rig-agent-runtime-1",
        "assignments:b": "review-e-rig-agent-runtime-2",
    }
    held = {}
    for stream, target in targets.items():
        await fill(redis, stream, G, 2)
        held[stream] = await read(redis, stream, G, owner, 2)
        await register(redis, stream, G, target)
        await register(redis, stream, G, stranger)  # fresh by idle, but no pod, no own heartbeat
        await beat(engine, "review-e", target)
        await idle_at_least(redis, stream, G, STALE_MS)
    report = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        pods=Pods({}, listed=True),
        effects=port(engine, settings),
    )
    assert (report.reclaimed, report.no_target) == (4, 0)
    for stream, target in targets.items():
        assert await owners(redis, stream, G) == dict.fromkeys(held[stream], target)
    [evidence] = built
    beats = evidence.consumer_heartbeats
    assert beats == {}  # the holders' own heartbeats only: the owner has none
    with pytest.raises(TypeError):
        beats[ConsumerName(targets["assignments:a"])] = Heartbeat(evidence.now)  # type: ignore[index]


async def test_the_only_target_beyond_the_quiet_consumers_the_scan_summed_up(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    """The scan reads each group's consumers holding entries and only the first few others; a
    group where something moves is read in full, so a target past those few is still found."""
    ids = await scene(redis, engine)
    for n in range(12):  # quiet consumers of the silent agent, before the target by name
        await register(redis, S, G, f"review-e-codex-rig-agent-runtime-q{n:02}")
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (report.reclaimed, report.no_target) == (3, 0)
    assert await owners(redis, S, G) == dict.fromkeys(ids[:3], "review-e-rig-agent-runtime-0")


async def test_a_second_scan_finds_nothing_to_do(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    await scene(redis, engine)
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    again = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (again.reclaimed, again.consumers_down, again.pending) == (0, 0, 3)


async def test_dry_run_changes_nothing(
    redis: Redis, engine: AsyncEngine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await scene(redis, engine)
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        report = await cycle.reap_once(
            redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=True)
        )
    assert (report.reclaimed, report.dry_run) == (3, True)
    assert await owners(redis, S, G) == dict.fromkeys(ids[:3], "review-e-codex-rig-agent-runtime-0")
    assert await queries.count_events(engine, tenant="default", kind="RECLAIMED") == 0
    assert "[StreamReclaim] Reclaimed" not in caplog.text
    assert f"[StreamReclaim] DRY RUN: would reclaim {ids[0]} on rig:dispatch" in caplog.text


async def test_live_owners_and_fresh_entries_are_left_alone(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    # Fresh for long enough that a loaded machine cannot age them between the read and the scan.
    stale_ms = 2_000
    settings = make_settings(
        streams=(S,), agent_ids=("review-e", "review-e-codex"), entry_stale_ms=stale_ms
    )
    ids = await fill(redis, S, G, 4)
    await read(redis, S, G, "review-e-rig-agent-runtime-0", 2)  # live agent, stale entries
    await beat(engine, "review-e", "review-e-rig-agent-runtime-0")
    await idle_at_least(redis, S, G, stale_ms)
    await read(redis, S, G, "review-e-codex-rig-agent-runtime-0", 2)  # dead agent, fresh entries
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 0 and report.no_target == 0
    assert await owners(redis, S, G) == {
        ids[0]: "review-e-rig-agent-runtime-0",
        ids[1]: "review-e-rig-agent-runtime-0",
        ids[2]: "review-e-codex-rig-agent-runtime-0",
        ids[3]: "review-e-codex-rig-agent-runtime-0",
    }


async def test_no_target_is_counted_and_logged(
    redis: Redis, engine: AsyncEngine, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    ids = await fill(redis, S, G, 2)
    await read(redis, S, G, "review-e-codex-rig-agent-runtime-0", 2)
    await idle_at_least(redis, S, G, STALE_MS)
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        report = await cycle.reap_once(
            redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
        )
    assert (report.reclaimed, report.no_target) == (0, 2)
    assert await owners(redis, S, G) == dict.fromkeys(ids, "review-e-codex-rig-agent-runtime-0")
    assert (
        "[StreamReclaim] No live consumer in group workers of rig:dispatch to take 2 entries of "
        "review-e-codex-rig-agent-runtime-0; left in place"
    ) in caplog.text


async def test_worn_out_entries_are_dead_lettered(
    redis: Redis,
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(
        streams=(S,), agent_ids=("review-e", "review-e-codex"), entry_stale_ms=0, max_deliveries=2
    )
    ids = await scene(redis, engine, held=2)
    # The first entry is delivered a second time (a re-read of the pending list).
    await redis.xreadgroup(G, "review-e-codex-rig-agent-runtime-0", {S: "0"}, count=1)
    with caplog.at_level(logging.INFO, logger="rig_conductor"):
        report = await cycle.reap_once(
            redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
        )
    assert (report.dead_lettered, report.reclaimed) == (1, 1)
    assert (
        f"[StreamReclaim] Dead-lettered {ids[0]} on rig:dispatch after 2 deliveries" in caplog.text
    )
    assert await owners(redis, S, G) == {ids[1]: "review-e-rig-agent-runtime-0"}
    [(_, fields)] = await redis.xrange("rig:dispatch:dlq")
    assert (
        fields["originalId"] == ids[0]
        and fields["issueId"] == "rc-1"
        and fields["deliveries"] == "2"
    )
    async with engine.connect() as conn:
        [row] = (await conn.execute(select(events).where(events.c.kind == "DEAD_LETTERED"))).all()
    assert (row.entry_id, row.issue_id, row.detail["deliveries"]) == (ids[0], "rc-1", 2)


async def test_pod_gone_moves_entries_before_they_are_stale(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    ids = await fill(redis, S, G, 2)
    await beat(engine, "review-e", "review-e-rig-agent-runtime-0")
    await beat(engine, "review-e", "review-e-rig-agent-runtime-1")
    await read(redis, S, G, "review-e-rig-agent-runtime-1", 2)
    await register(redis, S, G, "review-e-rig-agent-runtime-0")
    gone = Pods({ConsumerName("review-e-rig-agent-runtime-1"): PodState.GONE})
    unknown = Pods({ConsumerName("review-e-rig-agent-runtime-1"): PodState.UNKNOWN})
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, pods=unknown, effects=port(engine, settings)
    )
    assert report.reclaimed == 0
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, pods=gone, effects=port(engine, settings)
    )
    assert report.reclaimed == 2
    assert await owners(redis, S, G) == dict.fromkeys(ids, "review-e-rig-agent-runtime-0")


async def test_whole_pending_list_in_one_scan(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    ids = await scene(redis, engine, held=2_345)
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 2_345
    assert set((await owners(redis, S, G)).values()) == {"review-e-rig-agent-runtime-0"}
    assert len(await owners(redis, S, G)) == len(ids) - 1


async def test_scan_reads_pending_lists_of_down_consumers_only(
    private_redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    redis = private_redis  # INFO commandstats counts this test's commands only
    await fill(redis, S, G, 60)
    for n in range(5):
        await read(redis, S, G, f"review-e-rig-agent-runtime-{n}", 10)
        await beat(engine, "review-e", f"review-e-rig-agent-runtime-{n}")
    await read(redis, S, G, "review-e-codex-rig-agent-runtime-0", 10)  # fresh entries
    await redis.config_resetstat()
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    stats = await redis.info("commandstats")
    # The group's oldest entry (XPENDING - + 1), then the down consumer's list, nobody else's:
    # no entry is old enough to have stalled (rule 4b), so live owners' lists are not read.
    assert stats["cmdstat_xpending"]["calls"] == 2


async def test_every_stream_matching_a_pattern_is_scanned(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    for stream in ("assignments:review-e", "assignments:dev-e"):
        await fill(redis, stream, "agents", 2)
        await read(redis, stream, "agents", "review-e-codex-rig-agent-runtime-0", 2)
        await register(redis, stream, "agents", "review-e-rig-agent-runtime-0")
    await beat(engine, "review-e", "review-e-rig-agent-runtime-0")
    for stream in ("assignments:review-e", "assignments:dev-e"):
        await idle_at_least(redis, stream, "agents", STALE_MS)
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (report.streams, report.groups, report.reclaimed) == (2, 2, 4)


async def test_nothing_is_acked_outside_the_dead_letter_path(
    private_redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    redis = private_redis  # INFO commandstats counts this test's commands only
    await scene(redis, engine, held=50)
    before = (await redis.xpending(S, G))["pending"]
    await redis.config_resetstat()
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (await redis.xpending(S, G))["pending"] == before
    assert "cmdstat_xack" not in await redis.info("commandstats")


async def test_redis_down_fails_the_scan_with_a_clear_reason(
    engine: AsyncEngine, settings: Settings
) -> None:
    dead = redis_kit.connect("redis://127.0.0.1:1/0")
    with pytest.raises(RedisError) as caught:
        await cycle.reap_once(
            redis=dead, engine=engine, settings=settings, effects=port(engine, settings)
        )
    await dead.aclose()
    assert cycle.describe_failure(caught.value).startswith("Redis unavailable")


async def test_postgres_down_fails_the_scan_and_the_next_one_runs(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    await scene(redis, engine)
    dead = pg.create_engine("postgresql+psycopg://postgres@127.0.0.1:1/rig")
    with pytest.raises(Exception) as caught:
        await cycle.reap_once(
            redis=redis, engine=dead, settings=settings, effects=port(dead, settings)
        )
    await dead.dispose()
    assert cycle.describe_failure(caught.value).startswith("PostgreSQL unavailable")
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 3


def test_report_json_has_the_contract_keys() -> None:
    keys: dict[str, Any] = cycle.ScanReport(dry_run=False).model_dump(by_alias=True)
    assert {
        "streams",
        "groups",
        "pending",
        "reclaimed",
        "deadLettered",
        "noTarget",
        "dryRun",
        "durationMs",
    } <= set(keys)
