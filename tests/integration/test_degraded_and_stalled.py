"""Rules 3b and 4b against real servers: degraded runs as PostgreSQL records them, and the scan
moving a degraded owner's entries and a stalled entry, fencing the old attempts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from redis.asyncio import Redis
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake, queries, work
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import AgentId, ConsumerName, StagedOutput
from rig_conductor.policy import degraded
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings

from .helpers import fill, owners, port, read, register

S, G = "assignments:review-e", "review"
CODEX, CLAUDE = "review-e-codex-0", "review-e-0"


async def beat(
    engine: AsyncEngine, *beats: tuple[str, str | None, bool], break_ms: int = 60_000
) -> datetime:
    """One batch of (agent, consumer, degraded); the receipt time."""
    return await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[
            intake.HeartbeatIn(
                AgentId(a), ConsumerName(c) if c else None, d, ("quota",) if d else ()
            )
            for a, c, d in beats
        ],
        break_ms=break_ms,
    )


async def since(
    engine: AsyncEngine,
) -> tuple[dict[str, datetime | None], dict[str, datetime | None]]:
    """Rule 3b's run start as policy decides it from what PostgreSQL recorded: per agent (for
    its consumers that never heartbeat by name) and per consumer that heartbeats by name."""
    evidence = await queries.load_evidence(
        engine, tenant="default", configured_agents=(), down_ms=60_000
    )
    return (
        {a: degraded.run_start(None, hb) for a, hb in evidence.agent_heartbeats.items()},
        {c: degraded.run_start(hb, None) for c, hb in evidence.consumer_heartbeats.items()},
    )


async def test_a_degraded_run_keeps_its_start_until_it_breaks(engine: AsyncEngine) -> None:
    first = await beat(engine, ("review-e-codex", CODEX, True))
    await beat(engine, ("review-e-codex", CODEX, True))
    assert (await since(engine))[1][CODEX] == first
    await beat(engine, ("review-e-codex", CODEX, False))
    assert (await since(engine))[1][CODEX] is None
    again = await beat(engine, ("review-e-codex", CODEX, True))
    assert (await since(engine))[1][CODEX] == again != first


async def test_a_flap_within_one_batch_restarts_the_run(engine: AsyncEngine) -> None:
    await beat(engine, ("review-e-codex", CODEX, True))
    flapped = await beat(
        engine,
        ("review-e-codex", CODEX, True),
        ("review-e-codex", CODEX, False),
        ("review-e-codex", CODEX, True),
    )
    assert (await since(engine))[1][CODEX] == flapped


async def test_only_heartbeats_naming_no_consumer_make_the_agents_run(
    engine: AsyncEngine,
) -> None:
    first = await beat(engine, ("review-e-codex", None, True))
    # The agent's named consumers come and go healthy: the agent's own run goes on.
    await beat(engine, ("review-e-codex", CODEX, False))
    agents, consumers = await since(engine)
    assert agents["review-e-codex"] == first and consumers[CODEX] is None
    await beat(engine, ("review-e-codex", None, False))
    assert (await since(engine))[0]["review-e-codex"] is None


async def test_a_degraded_consumers_beats_neither_start_nor_break_its_agents_run(
    engine: AsyncEngine,
) -> None:
    await beat(engine, ("review-e-codex", None, False))
    sick = await beat(engine, ("review-e-codex", CODEX, True))
    agents, consumers = await since(engine)
    assert agents["review-e-codex"] is None and consumers[CODEX] == sick
    first = await beat(engine, ("review-e-codex", None, True))
    await beat(engine, ("review-e-codex", CODEX, False), ("review-e-codex", None, True))
    agents, consumers = await since(engine)
    assert agents["review-e-codex"] == first and consumers[CODEX] is None


async def test_a_flap_of_the_agents_own_beats_within_one_batch_restarts_its_run(
    engine: AsyncEngine,
) -> None:
    await beat(engine, ("review-e-codex", None, True))
    flapped = await beat(
        engine,
        ("review-e-codex", None, False),
        ("review-e-codex", CODEX, True),
        ("review-e-codex", None, True),
    )
    agents, consumers = await since(engine)
    assert agents["review-e-codex"] == flapped == consumers[CODEX]


async def heard_earlier(engine: AsyncEngine, by: str) -> None:
    """Every time the heartbeat tables hold moved back by the interval `by`: as if heard then."""
    later = {
        "agent_heartbeats": (
            "last_heartbeat_at",
            "heard_since",
            "degraded_since",
            "anonymous_at",
            "anonymous_since",
        ),
        "consumer_heartbeats": (
            "last_heartbeat_at",
            "heard_since",
            "degraded_since",
            "status_since",
        ),
    }
    async with engine.begin() as conn:
        for table, columns in later.items():
            moved = ", ".join(f"{c} = {c} - interval '{by}'" for c in columns)
            await conn.execute(text(f"UPDATE {table} SET {moved}"))


async def test_a_silence_longer_than_the_break_ends_the_interval_not_the_run(
    engine: AsyncEngine,
) -> None:
    first = await beat(engine, ("review-e-codex", None, True), ("review-e-codex", CODEX, True))
    await heard_earlier(engine, "2 minutes")
    await beat(engine, ("review-e-codex", None, True), ("review-e-codex", CODEX, True))
    async with engine.connect() as conn:
        ended = (await conn.execute(text("SELECT consumer, degraded FROM liveness"))).all()
    # The silence of 2 minutes, longer than the break of 1, ended both intervals...
    assert sorted(ended, key=str) == sorted([(None, True), (CODEX, True)], key=str)
    agents, consumers = await since(engine)
    # ...and not the run: every heartbeat of it was degraded (rule 3b).
    assert agents["review-e-codex"] == consumers[CODEX] == first - timedelta(minutes=2)
    await beat(engine, ("review-e-codex", None, False), ("review-e-codex", CODEX, False))
    again = await beat(engine, ("review-e-codex", None, True), ("review-e-codex", CODEX, True))
    assert await since(engine) == ({"review-e-codex": again}, {CODEX: again})


async def stored_since(
    engine: AsyncEngine,
) -> tuple[dict[str, datetime | None], dict[str, datetime | None]]:
    """`degraded_since` as the intake writes it, per agent and per consumer."""
    async with engine.connect() as conn:
        agents = await conn.execute(text("SELECT agent_id, degraded_since FROM agent_heartbeats"))
        consumers = await conn.execute(
            text("SELECT consumer, degraded_since FROM consumer_heartbeats")
        )
        return {a: at for a, at in agents}, {c: at for c, at in consumers}


async def test_the_previous_releases_column_reads_the_run_policy_decides(
    engine: AsyncEngine,
) -> None:
    """Replicas of the previous release, during a rolling upgrade, judge rule 3b on
    `degraded_since`: the intake keeps it equal to the run start policy decides, step by step."""
    codex, claude = ("review-e-codex", CODEX), ("review-e", CLAUDE)
    steps: list[list[tuple[str, str | None, bool]]] = [
        [(*codex, True), ("review-e", None, True)],
        [(*codex, True), (*claude, False)],
        [("review-e", None, False), (*claude, True)],
        [(*codex, True), (*codex, False), (*codex, True)],
        [("review-e", None, True), (*claude, True)],
        [("review-e", None, True), ("review-e", None, False), ("review-e", None, True)],
        [(*codex, False), ("review-e-codex", None, False)],
        [("review-e-codex", None, True), (*codex, True)],
    ]
    for n, batch in enumerate(steps):
        if n == 4:
            await heard_earlier(engine, "2 minutes")
        await beat(engine, *batch)
        assert await stored_since(engine) == await since(engine), f"after step {n}"


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(
        streams=(S,),
        agent_ids=("review-e", "review-e-codex"),
        degraded_grace_ms=300,
        entry_deadline_ms=400,
        agent_down_ms=60_000,
    )


async def test_a_degraded_owner_loses_its_entries_to_healthy_consumers(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    # Thresholds that the setup, however slow the machine, stays inside: the first scan must
    # come within the grace of the degraded beat and within the deadline of the read.
    settings = settings.model_copy(update={"degraded_grace_ms": 1_500, "entry_deadline_ms": 3_000})
    ids = await fill(redis, S, G, 6)
    await read(redis, S, G, CODEX, 6)
    await register(redis, S, G, CLAUDE)
    await register(redis, S, G, "review-e-1")
    await beat(engine, ("review-e-codex", CODEX, True), ("review-e", CLAUDE, False))
    await beat(engine, ("review-e", "review-e-1", False))
    started = await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport("WORK_STARTED", "review-e-codex", S, ids[0], CODEX),
    )
    # Within the grace period nothing moves, however the entries' idle times stand.
    assert (
        await cycle.reap_once(
            redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
        )
    ).reclaimed == 0
    await asyncio.sleep(1.6)  # past the grace of 1.5 s since the degraded beat
    await beat(engine, ("review-e-codex", CODEX, True))  # still degraded, still alive
    await redis.xclaim(S, G, CODEX, 0, ids, justid=True)  # and retrying: idle back to zero
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 6 and report.reclaimed_by_reason == {"degraded": 6}
    assert sorted((await owners(redis, S, G)).values()) == [CLAUDE] * 3 + ["review-e-1"] * 3
    async with engine.connect() as conn:
        rows = (await conn.execute(select(events).where(events.c.kind == "RECLAIMED"))).all()
    assert {row.detail["reason"] for row in rows} == {"degraded"}
    # The move reserved a new attempt: the degraded owner's late success is fenced.
    late = await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport(
            "WORK_COMPLETED", "review-e-codex", S, ids[0], CODEX, attempt=started.attempt
        ),
    )
    assert not late.accepted


async def test_no_healthy_target_holds_the_entries(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    settings = settings.model_copy(update={"entry_deadline_ms": 3_000})  # past the grace only
    await fill(redis, S, G, 3)
    await read(redis, S, G, CODEX, 3)
    await register(redis, S, G, CLAUDE)
    await beat(engine, ("review-e-codex", CODEX, True), ("review-e", CLAUDE, True))
    await asyncio.sleep(0.35)  # past the grace of 300 ms since the degraded beat
    await beat(engine, ("review-e-codex", CODEX, True))
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (report.reclaimed, report.degraded_held, report.no_target) == (0, 3, 0)
    assert set((await owners(redis, S, G)).values()) == {CODEX}


async def test_a_stalled_entry_moves_alone_and_its_attempt_is_fenced(
    redis: Redis, engine: AsyncEngine, settings: Settings
) -> None:
    # A deadline long enough that the scan comes well inside it after the last progress, even
    # on a loaded machine; the hung attempt is past it.
    settings = settings.model_copy(update={"entry_deadline_ms": 2_000})
    ids = await fill(redis, S, G, 3)
    await read(redis, S, G, CLAUDE, 3)
    await register(redis, S, G, "review-e-1")
    await beat(engine, ("review-e", CLAUDE, False), ("review-e", "review-e-1", False))
    hung = await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport("WORK_STARTED", "review-e", S, ids[0], CLAUDE),
    )
    busy = await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport("WORK_STARTED", "review-e", S, ids[1], CLAUDE),
    )
    await asyncio.sleep(2.1)  # the hung attempt past its deadline of 2 s
    # ids[1] keeps reporting progress; ids[2] was re-read just now (never named: idle decides).
    progress = work.WorkReport("WORK_PROGRESS", "review-e", S, ids[1], CLAUDE, attempt=busy.attempt)
    assert (await work.record_work(engine, tenant="default", report=progress)).accepted
    await redis.xclaim(S, G, CLAUDE, 0, [ids[2]], justid=True)
    await beat(engine, ("review-e", CLAUDE, False), ("review-e", "review-e-1", False))
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed_by_reason == {"stalled": 1}
    assert await owners(redis, S, G) == {ids[0]: "review-e-1", ids[1]: CLAUDE, ids[2]: CLAUDE}
    for kind in ("WORK_PROGRESS", "WORK_COMPLETED"):
        fenced = work.WorkReport(kind, "review-e", S, ids[0], CLAUDE, attempt=hung.attempt)
        assert not (await work.record_work(engine, tenant="default", report=fenced)).accepted


@pytest.mark.parametrize("outputs", [0, 1], ids=["nothing-staged", "outputs-unpublished"])
async def test_an_entry_done_but_not_yet_acked_is_not_stalled(
    redis: Redis, engine: AsyncEngine, settings: Settings, outputs: int
) -> None:
    """Between an accepted completion and the agent's XACK the entry is still pending, idle since
    it was read: a scan in that window must not take finished work for stalled work. When the
    completion staged files, its agent renames them and reports the publish before it acks:
    while it is alive and the completion fresh the entry is its own too (the next holder
    publishes them only once the owner is down)."""
    settings = settings.model_copy(update={"entry_deadline_ms": 1_000})
    ids = await fill(redis, S, G, 1)
    await read(redis, S, G, CLAUDE, 1)
    await register(redis, S, G, "review-e-1")
    started = await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport("WORK_STARTED", "review-e", S, ids[0], CLAUDE),
    )
    await asyncio.sleep(1.2)  # the entry's idle time past the deadline of 1 s
    staged = StagedOutput(f"/out/.rc-1.json.{ids[0]}.a1.tmp", "/out/rc-1.json")
    completed = work.WorkReport(
        "WORK_COMPLETED",
        "review-e",
        S,
        ids[0],
        CLAUDE,
        attempt=started.attempt,
        outputs=(staged,) * outputs,
    )
    assert (await work.record_work(engine, tenant="default", report=completed)).accepted
    await beat(engine, ("review-e", CLAUDE, False), ("review-e", "review-e-1", False))
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 0, report.reclaimed_by_reason
    assert await owners(redis, S, G) == {ids[0]: CLAUDE}
