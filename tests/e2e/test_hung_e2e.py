"""A handler that hangs while its agent stays alive (reaper rule 4b), end to end.

Real processes: `rig-conductor serve` and two `rig-conductor agent` processes. builder-h's
handler blocks on one issue without reporting progress, as a deadlocked CLI would; its agent
keeps heartbeating. At RIG_ENTRY_DEADLINE_MS the runtime abandons the call, and the reaper
moves that entry alone to builder-a. builder-h goes on with other work, and when the hung call
finally returns, its result is fenced: nothing is reported, nothing committed.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import any_, func, literal, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import consumer_heartbeats, events, scan_reports
from tests.integration.helpers import serve, wait_for

from .fleet import (
    AUDITED_TEST_S,
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    effects,
    heard_from,
    pending,
    run_audit,
    work_events,
)

pytestmark = pytest.mark.timeout(AUDITED_TEST_S)  # the hang case ends with a Spark audit

HUNG = ("builder-h", "builder-h-pod-0")
HEALTHY = ("builder-a", "builder-a-pod-0")
DEADLINE_S, SCAN_S = 2.0, 0.5
# Long work reporting progress every PROGRESS_S keeps its entry past LONG_DEADLINE_S: ten reports
# a deadline. With 2 s and a report every 0.5 s, one flake-loop round in seven saw the entry
# reclaimed as stalled: on two loaded cores, no report had been recorded for 2 s (each waits for
# the handler thread's sleep, its HTTP call and the conductor's commit). Rule 4b did as it says;
# the test had asked four reports in a row to be on time.
LONG_DEADLINE_S, PROGRESS_S = 5.0, 0.5
# After the move: builder-a's next read of its own pending list (every 1 s), and its start.
PICKUP_S = 2.0


class Timeline(NamedTuple):
    """When each step of the stuck entry's rescue happened, all on PostgreSQL's clock."""

    started: datetime  # the hung attempt's WORK_STARTED
    target_ready: datetime  # builder-a's first heartbeat: from then on it is a target
    moved: datetime  # the RECLAIMED row
    picked_up: datetime  # builder-a's WORK_STARTED of the new attempt


async def timeline(engine: AsyncEngine, entry_id: str, target: str) -> Timeline:
    def started(attempt: int) -> object:
        return (
            select(func.min(events.c.occurred_at))
            .where(events.c.kind == "WORK_STARTED", events.c.entry_id == entry_id)
            .where(events.c.attempt == attempt, events.c.fenced.is_(False))
            .scalar_subquery()
        )

    moved = (
        select(func.min(events.c.occurred_at))
        .where(events.c.kind == "RECLAIMED")
        .where(or_(events.c.entry_id == entry_id, literal(entry_id) == any_(events.c.entry_ids)))
        .scalar_subquery()
    )
    ready = (
        select(consumer_heartbeats.c.first_seen_at)
        .where(consumer_heartbeats.c.consumer == target)
        .scalar_subquery()
    )
    async with engine.connect() as conn:
        row = (await conn.execute(select(started(1), ready, moved, started(2)))).one()
    return Timeline(*row)


async def end_of_second_scan_after(engine: AsyncEngine, moment: datetime) -> datetime:
    """When the second scan that started at or after `moment` ended (the conductor keeps every
    scheduled scan's report, its end and its duration, on PostgreSQL's clock)."""
    started = scan_reports.c.finished_at - func.make_interval(
        0, 0, 0, 0, 0, 0, scan_reports.c.report["durationMs"].as_float() / 1000
    )
    query = (
        select(scan_reports.c.finished_at)
        .where(started >= moment, scan_reports.c.dry_run.is_(False))
        .order_by(started)
        .offset(1)
        .limit(1)
    )
    async with engine.connect() as conn:
        ended = (await conn.execute(query)).scalar_one_or_none()
    assert ended is not None, f"fewer than two scans began after {moment}"
    return ended


@pytest.mark.parametrize("handler", ["hang", "hang_async"])
async def test_a_hung_handler_loses_its_entry_not_its_liveness(
    handler: str,
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    deadline = {"RIG_ENTRY_DEADLINE_MS": str(int(DEADLINE_S * 1000))}
    env = conductor_env(
        [HUNG[0], HEALTHY[0]],
        RIG_AGENT_DOWN_MS="60000",
        RIG_SCAN_INTERVAL_S=str(SCAN_S),
        **deadline,
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        fleet_env = {"E2E_OUT_DIR": str(out), "E2E_HANG_FILE": str(hold), **deadline}
        with Fleet(redis_url, conductor.url, tmp_path, fleet_env) as fleet:
            hung = fleet.start(
                *HUNG, handler=f"tests.e2e.handlers:{handler}", E2E_HANG_ISSUES="rc-hung"
            )
            await wait_for(lambda: heard_from(api, hung.consumer), within=30)
            stuck = await dispatch(api, "rc-hung", {})
            await wait_for(lambda: (out / f"hanging-{hung.consumer}").exists(), within=15)
            healthy = fleet.start(*HEALTHY)
            await wait_for(lambda: heard_from(api, healthy.consumer), within=30)

            async def moved_and_done() -> bool:
                return stuck in await accepted_completions(engine)

            await wait_for(moved_and_done, within=30)
            # The hung agent keeps its other work.
            others = {f"rc-{n}": await dispatch(api, f"rc-{n}", {}) for n in range(1, 7)}

            async def all_done() -> bool:
                done = await accepted_completions(engine)
                return set(others.values()) <= set(done)

            await wait_for(all_done, within=30)
            hold.unlink()  # the hung call returns at last ...
            if handler == "hang":  # ... and a thread goes on to its build: too late to count
                late = out / "calls" / f"rc-hung.{hung.consumer}.a1"
                await wait_for(late.exists, within=15)
            # A completion is accepted before its XACK: wait for the acks, not just the reports.

            async def drained() -> bool:
                return await pending(redis) == {}

            await wait_for(drained, within=15)
            codes = fleet.stop_all()
        assert "Scan failed" not in conductor.stderr, conductor.stderr[-3000:]

    assert set(codes.values()) == {0}, fleet.logs(codes, dict.fromkeys(codes, 0))
    completions = await accepted_completions(engine)
    (done,) = completions[stuck]
    assert done.consumer == healthy.consumer
    # Moved within two scans of the moment it could be: its deadline passed and a target was
    # there (builder-a starts only once the entry hangs, which on a loaded machine can be later
    # than the deadline). Then picked up at builder-a's next read of its pending list.
    steps = await timeline(engine, stuck, healthy.consumer)
    movable = max(steps.started + timedelta(seconds=DEADLINE_S), steps.target_ready)
    # Two scans, as they ran: on a loaded machine a scan can outlast its interval, and the next
    # one then starts when it ends.
    assert steps.moved <= await end_of_second_scan_after(engine, movable), steps
    assert steps.picked_up - steps.moved <= timedelta(seconds=PICKUP_S), steps
    assert any(completions[e][0].consumer == hung.consumer for e in others.values())
    # The hung attempt reported its failure at the deadline and nothing after: no late success.
    hung_reports = [kind for kind, attempt, _ in await work_events(engine, stuck) if attempt == 1]
    assert hung_reports == ["WORK_STARTED", "WORK_FAILED"]
    assert effects(out)["rc-hung"]["consumer"] == healthy.consumer
    if handler == "hang_async":
        assert (out / f"cancelled-{hung.consumer}").read_text() == stuck
    if handler == "hang":
        summary = run_audit(database_url, redis_url, tmp_path / "audit")
        assert summary["lost"] == [] and summary["duplicates"] == []
        assert summary["reclaimsByReason"] == {"stalled": 1}


async def test_long_work_that_reports_progress_keeps_its_entry(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    deadline = {"RIG_ENTRY_DEADLINE_MS": str(int(LONG_DEADLINE_S * 1000))}
    env = conductor_env(
        [HUNG[0], HEALTHY[0]],
        RIG_AGENT_DOWN_MS="60000",
        RIG_SCAN_INTERVAL_S=str(SCAN_S),
        **deadline,
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(
            redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out), **deadline}
        ) as fleet:
            worker = fleet.start(
                *HUNG,
                handler="tests.e2e.handlers:slow",
                E2E_SLOW_ISSUES="rc-long",
                E2E_SLOW_S=str(2 * LONG_DEADLINE_S),  # two deadlines long
                E2E_PROGRESS_S=str(PROGRESS_S),
            )
            await wait_for(lambda: heard_from(api, worker.consumer), within=30)
            entry = await dispatch(api, "rc-long", {})

            async def started() -> bool:
                return any(
                    kind == "WORK_STARTED" for kind, _, _ in await work_events(engine, entry)
                )

            await wait_for(started, within=15)
            other = fleet.start(*HEALTHY)  # a target the reaper could move it to
            await wait_for(lambda: heard_from(api, other.consumer), within=30)

            async def done() -> bool:
                return entry in await accepted_completions(engine)

            await wait_for(done, within=30)
            codes = fleet.stop_all()
        assert "Reclaimed" not in conductor.stderr, conductor.stderr[-8000:]

    assert set(codes.values()) == {0}, fleet.logs(codes, dict.fromkeys(codes, 0))
    (completion,) = (await accepted_completions(engine))[entry]
    assert (completion.consumer, completion.attempt) == (worker.consumer, 1)
    progress = [kind for kind, _, fenced in await work_events(engine, entry) if not fenced]
    assert progress.count("WORK_PROGRESS") == round(2 * LONG_DEADLINE_S / PROGRESS_S)
