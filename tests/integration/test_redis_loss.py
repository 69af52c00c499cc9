"""Redis that lost its data (restarted empty, flushed, failed over to an empty replica): the next
scan tells it by the epoch marker and appends every unfinished dispatch again from PostgreSQL,
once, started or not; the lost entries are fenced off, so work on them never counts twice.

Here the loss is a FLUSHDB of the test's database; tests/integration/test_redis_restart.py
restarts a real server with real agents."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches as dispatch_rows
from rig_conductor.adapters.postgres import recovery_writes, work
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.postgres.tables import assignments, dispatches, events, redis_epochs
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.app import create_app
from rig_conductor.domain import StagedOutput, StreamKey
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings

from .console_kit import AGENT, client_of
from .helpers import port

S = StreamKey("rig:dispatch")
HOLDER = "builder-pod-0"


def fields(issue: str) -> dict[str, str]:
    return {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "builder", "payload": "{}"}


async def dispatched(redis: Redis, engine: AsyncEngine, issue: str) -> str:
    """A dispatch as the API makes it: appended once, then recorded with its fields."""
    entry_id, _ = await redis_writes.append_once(
        redis, stream=S, key=issue, fields=fields(issue), remember_s=3600
    )
    await dispatch_rows.record_dispatch(
        engine, tenant="default", key=issue, issue_id=issue, agent_id="builder",
        stream=S, entry_id=entry_id, fields=fields(issue),
    )  # fmt: skip
    return entry_id


async def report(
    engine: AsyncEngine, kind: str, entry_id: str, issue: str, *, consumer: str = HOLDER,
    attempt: int | None = None, group: str | None = None, outputs: tuple[StagedOutput, ...] = (),
) -> work.WorkOutcome:  # fmt: skip
    return await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport(
            kind=kind,  # type: ignore[arg-type]
            agent_id="builder",
            stream=S,
            entry_id=entry_id,
            consumer=consumer,
            issue_id=issue,
            attempt=attempt,
            group=group,
            outputs=outputs,
        ),
    )


async def recorded_entry(engine: AsyncEngine, issue: str) -> str:
    async with engine.connect() as conn:
        found = await conn.scalar(
            select(dispatches.c.entry_id).where(dispatches.c.idempotency_key == issue)
        )
    assert found is not None
    return str(found)


async def state_of(engine: AsyncEngine, entry_id: str) -> tuple[str, int] | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(assignments.c.state, assignments.c.attempt).where(
                    assignments.c.entry_id == entry_id
                )
            )
        ).first()
    return (row.state, row.attempt) if row else None


async def completions(engine: AsyncEngine, issue: str) -> int:
    """The issue's accepted completions: what counts as done."""
    async with engine.connect() as conn:
        found = await conn.scalar(
            select(func.count()).where(
                events.c.kind == "WORK_COMPLETED",
                events.c.issue_id == issue,
                events.c.fenced.is_(False),
            )
        )
    return int(found or 0)


async def replacements(engine: AsyncEngine) -> dict[str, list[str]]:
    """issue -> the entries its ISSUE_ASSIGNED rows say were lost and replaced."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(events.c.issue_id, events.c.detail["replaces"].astext).where(
                events.c.kind == "ISSUE_ASSIGNED", events.c.detail.has_key("replaces")
            )
        )
        found: dict[str, list[str]] = {}
        for issue, replaced in rows:
            found.setdefault(issue, []).append(replaced)
    return found


async def stream_issues(redis: Redis) -> dict[str, str]:
    """issue -> entry id, for every entry of the stream."""
    return {f["issueId"]: entry_id for entry_id, f in await redis.xrange(S)}


async def test_every_unfinished_dispatch_is_appended_again_once_and_the_lost_ones_fenced(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), dispatch_stream=S)
    metrics = Metrics()
    new = await dispatched(redis, engine, "rc-new")  # nobody started it
    started = await dispatched(redis, engine, "rc-started")  # in hand when Redis lost it
    assert (await report(engine, "WORK_STARTED", started, "rc-started")).attempt == 1
    failed = await dispatched(redis, engine, "rc-failed")  # left pending after a failure
    await report(engine, "WORK_STARTED", failed, "rc-failed")
    await report(engine, "WORK_FAILED", failed, "rc-failed", attempt=1)
    done = await dispatched(redis, engine, "rc-done")
    await report(engine, "WORK_STARTED", done, "rc-done")
    await report(engine, "WORK_COMPLETED", done, "rc-done", attempt=1)
    dead = await dispatched(redis, engine, "rc-dead")
    await pg_writes.dead_lettered(
        engine, tenant="default", stream=S, group="builders", entries=[(dead, "rc-dead", 5)]
    )

    first = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        metrics=metrics,
        effects=port(engine, settings, metrics=metrics),
    )
    assert (first.redis_data_lost, first.redispatched) == ([], 0)
    epoch = await redis.get(redis_keys.epoch_key(S))
    async with engine.connect() as conn:
        assert await conn.scalar(select(redis_epochs.c.epoch)) == epoch is not None

    await redis.flushdb()  # Redis lost everything: streams, groups, markers, the epoch

    dry = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=True)
    )
    assert (dry.redis_data_lost, dry.redispatched) == ([S], 3)
    assert await redis.exists(S, redis_keys.epoch_key(S)) == 0  # a dry run changes nothing

    scan = await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        metrics=metrics,
        effects=port(engine, settings, metrics=metrics),
    )
    assert (scan.redis_data_lost, scan.redispatched) == ([S], 3)
    issues = await stream_issues(redis)
    assert sorted(issues) == ["rc-failed", "rc-new", "rc-started"]
    for issue, entry_id in issues.items():
        assert await recorded_entry(engine, issue) == entry_id
        assert await redis.get(redis_keys.dispatched_key(S, issue)) == entry_id
    assert await replacements(engine) == {
        "rc-new": [new],
        "rc-started": [started],
        "rc-failed": [failed],
    }
    # Every lost entry is fenced off for good; the finished ones are left as they were.
    assert await state_of(engine, new) == ("superseded", 1)
    assert await state_of(engine, started) == ("superseded", 2)
    assert await state_of(engine, failed) == ("superseded", 2)
    assert await state_of(engine, done) == ("done", 1)
    assert await state_of(engine, dead) == ("dead", 5)
    new_epoch = await redis.get(redis_keys.epoch_key(S))
    async with engine.connect() as conn:
        assert await conn.scalar(select(redis_epochs.c.epoch)) == new_epoch != epoch

    # The holder finishes the lost entry it had in hand: fenced, through the API too. The new
    # entry's completion is the one that counts.
    late = await report(engine, "WORK_PROGRESS", started, "rc-started", attempt=1)
    assert (late.accepted, late.state) == (False, "superseded")
    again = issues["rc-started"]
    assert (await report(engine, "WORK_STARTED", again, "rc-started", consumer="b-1")).accepted
    assert (
        await report(engine, "WORK_COMPLETED", again, "rc-started", consumer="b-1", attempt=1)
    ).accepted
    app = _app(make_settings)
    async for api in client_of(app):
        answer = await _complete(api, started, "rc-started")
        assert answer.status_code == 409, answer.text
        assert answer.json()["state"] == "superseded"
        assert "appended again" in answer.json()["detail"]
    assert await completions(engine, "rc-started") == 1

    assert metrics.redis_data_losses.labels(S)._value.get() == 1
    assert metrics.redispatched.labels(S, "redis-data-loss")._value.get() == 3
    quiet = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (quiet.redis_data_lost, quiet.redispatched, await redis.xlen(S)) == ([], 0, 3)


def _app(make_settings: Callable[..., Settings]) -> FastAPI:
    settings = make_settings(streams=(S,), dispatch_stream=S, api_tokens=AGENT)
    return create_app(settings, schedule_reaper=False)


async def _complete(api: httpx.AsyncClient, entry_id: str, issue: str) -> httpx.Response:
    return await api.post(
        "/api/events",
        headers={"Authorization": f"Bearer {AGENT}"},
        json={
            "type": "WORK_COMPLETED", "agentId": "builder", "consumer": HOLDER, "stream": S,
            "entryId": entry_id, "issueId": issue, "attempt": 1,
        },
    )  # fmt: skip


async def test_two_conductors_recovering_at_once_append_each_dispatch_once(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), dispatch_stream=S)
    issues = [f"rc-{i}" for i in range(30)]
    for issue in issues:
        entry_id = await dispatched(redis, engine, issue)
        if issue.endswith("0"):
            await report(engine, "WORK_STARTED", entry_id, issue)
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    await redis.flushdb()

    scans = await asyncio.gather(
        *(
            cycle.reap_once(
                redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
            )
            for _ in range(2)
        )
    )

    assert sum(s.redispatched for s in scans) == len(issues)
    found = await stream_issues(redis)
    assert await redis.xlen(S) == len(issues) and sorted(found) == sorted(issues)
    for issue in issues:
        assert await recorded_entry(engine, issue) == found[issue]
    assert {i: len(r) for i, r in (await replacements(engine)).items()} == dict.fromkeys(issues, 1)


async def test_a_dispatch_the_client_retried_first_is_followed_not_appended_twice(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), dispatch_stream=S)
    lost = await dispatched(redis, engine, "rc-retried")
    await report(engine, "WORK_STARTED", lost, "rc-retried")
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    await redis.flushdb()
    # The client retries before the next scan: its append wins the key; the record keeps the
    # lost entry (a repeat records nothing new).
    retried = await dispatched(redis, engine, "rc-retried")
    assert retried != lost and await recorded_entry(engine, "rc-retried") == lost

    scan = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )

    assert (scan.redis_data_lost, scan.redispatched, await redis.xlen(S)) == ([S], 1, 1)
    assert await recorded_entry(engine, "rc-retried") == retried
    assert await state_of(engine, lost) == ("superseded", 2)
    assert await replacements(engine) == {"rc-retried": [lost]}


async def test_an_entry_its_holder_completed_before_the_scan_is_not_appended_again(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), dispatch_stream=S)
    held = await dispatched(redis, engine, "rc-held")
    await report(engine, "WORK_STARTED", held, "rc-held")
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    await redis.flushdb()
    assert (await report(engine, "WORK_COMPLETED", held, "rc-held", attempt=1)).accepted

    scan = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )

    assert (scan.redis_data_lost, scan.redispatched, await redis.exists(S)) == ([S], 0, 0)
    assert await completions(engine, "rc-held") == 1


async def test_a_recovery_cut_off_half_way_is_finished_by_the_next_scan(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,), dispatch_stream=S)
    for issue in ("rc-a", "rc-b"):
        await dispatched(redis, engine, issue)
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    await redis.flushdb()
    # A conductor found the loss, set a new marker, appended rc-a and died before recording
    # anything in PostgreSQL.
    await redis_writes.claim_epoch(redis, stream=S, epoch="set-by-a-conductor-that-died")
    appended, _ = await redis_writes.append_once(
        redis, stream=S, key="rc-a", fields=fields("rc-a"), remember_s=3600
    )

    scan = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )

    assert (scan.redis_data_lost, scan.redispatched) == ([S], 2)
    found = await stream_issues(redis)
    assert sorted(found) == ["rc-a", "rc-b"] and found["rc-a"] == appended
    async with engine.connect() as conn:
        assert await conn.scalar(select(redis_epochs.c.epoch)) == "set-by-a-conductor-that-died"
    quiet = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (quiet.redis_data_lost, quiet.redispatched) == ([], 0)


async def grouped(
    engine: AsyncEngine, kind: str, entry_id: str, issue: str, group: str, consumer: str,
    attempt: int | None = None, outputs: tuple[StagedOutput, ...] = (),
) -> work.WorkOutcome:  # fmt: skip
    """A WORK_* report read in `group` (fan-out: several groups read the stream)."""
    return await report(
        engine, kind, entry_id, issue, consumer=consumer, attempt=attempt, group=group,
        outputs=outputs,
    )  # fmt: skip


async def finish(engine: AsyncEngine, entry_id: str, issue: str, group: str, consumer: str) -> None:
    started = await grouped(engine, "WORK_STARTED", entry_id, issue, group, consumer)
    done = await grouped(
        engine, "WORK_COMPLETED", entry_id, issue, group, consumer, attempt=started.attempt
    )
    assert done.accepted


async def test_fan_out_each_group_gets_back_what_it_had_not_finished(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    """Two groups read the stream (builders first, reviewers since rc-0). After the loss a
    dispatch is appended again when either group has not finished it; the group that had
    finished it is answered "done" on the new entry (publishing what it had not), the other
    runs it. A dispatch from before a group read the stream is not that group's work."""
    settings = make_settings(streams=(S,), dispatch_stream=S)
    pre = await dispatched(redis, engine, "rc-pre")  # before the reviewers read the stream
    await finish(engine, pre, "rc-pre", "builders", "b-0")
    zero = await dispatched(redis, engine, "rc-0")
    await finish(engine, zero, "rc-0", "builders", "b-0")
    await finish(engine, zero, "rc-0", "reviewers", "r-0")
    lagging = await dispatched(redis, engine, "rc-a")  # the reviewers had not read it yet
    await finish(engine, lagging, "rc-a", "builders", "b-0")
    both = await dispatched(redis, engine, "rc-b")
    await finish(engine, both, "rc-b", "builders", "b-0")
    await finish(engine, both, "rc-b", "reviewers", "r-0")
    unpublished = await dispatched(redis, engine, "rc-c")  # builders in hand, reviewers done
    await grouped(engine, "WORK_STARTED", unpublished, "rc-c", "builders", "b-0")
    staged = StagedOutput(f"/out/.rc-c.json.{unpublished}.a1.tmp", "/out/rc-c.json")
    assert (await grouped(engine, "WORK_STARTED", unpublished, "rc-c", "reviewers", "r-0")).accepted
    completed = await grouped(
        engine, "WORK_COMPLETED", unpublished, "rc-c", "reviewers", "r-0", attempt=1,
        outputs=(staged,),
    )  # fmt: skip
    assert completed.accepted
    await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    await redis.flushdb()

    scan = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (scan.redis_data_lost, scan.redispatched) == ([S], 2)
    issues = await stream_issues(redis)
    assert sorted(issues) == ["rc-a", "rc-c"]

    # rc-a: done for the builders (acked without running), the reviewers' work to run.
    again = await grouped(engine, "WORK_STARTED", issues["rc-a"], "rc-a", "builders", "b-1")
    assert (again.accepted, again.state, again.outputs) == (False, "done", ())
    fresh = await grouped(engine, "WORK_STARTED", issues["rc-a"], "rc-a", "reviewers", "r-1")
    assert (fresh.accepted, fresh.attempt) == (True, 1)
    # rc-c: the reviewers' accepted completion carried over with its outputs to publish; the
    # builders' attempt in hand was lost with the entry, so they run it.
    carried = await grouped(engine, "WORK_STARTED", issues["rc-c"], "rc-c", "reviewers", "r-1")
    assert (carried.accepted, carried.state, carried.outputs) == (False, "done", (staged,))
    rerun = await grouped(engine, "WORK_STARTED", issues["rc-c"], "rc-c", "builders", "b-1")
    assert (rerun.accepted, rerun.attempt) == (True, 1)
    async with engine.connect() as conn:
        carried_from = dict(
            (
                await conn.execute(
                    select(events.c.group_name, events.c.detail["carriedFrom"].astext).where(
                        events.c.kind == "WORK_COMPLETED", events.c.detail.has_key("carriedFrom")
                    )
                )
            ).all()
        )
    assert carried_from == {"builders": lagging, "reviewers": unpublished}
    quiet = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert (quiet.redis_data_lost, quiet.redispatched) == ([], 0)


async def test_a_start_of_the_new_entry_waits_for_the_rows_that_carry_the_finished_work(
    redis: Redis, engine: AsyncEngine
) -> None:
    """An agent reads the entry appended again the moment it is appended, and starts it before
    the recovery has written the new entry's rows: the start waits for them, and a group that
    had finished the dispatch is answered "done" rather than given attempt 1."""
    entry = await dispatched(redis, engine, "rc-1")
    await finish(engine, entry, "rc-1", "builders", "b-0")
    await finish(engine, entry, "rc-1", "reviewers", "r-0")
    dispatch = dispatch_rows.RecentDispatch("rc-1", S, entry, "rc-1", "builder", fields("rc-1"))
    fence = await recovery_writes.supersede(
        engine, tenant="default", dispatch=dispatch, expected=["builders", "reviewers", "qa"]
    )
    assert fence is not None  # "qa" has not done it: it comes back
    async with recovery_writes.appending(engine, tenant="default", dispatch=dispatch) as conn:
        appended = await redis.xadd(S, fields("rc-1"))
        start = asyncio.create_task(
            grouped(engine, "WORK_STARTED", appended, "rc-1", "reviewers", "r-1")
        )
        await asyncio.sleep(0.5)  # time for a start that does not wait to be answered
        assert not start.done(), "the start did not wait for the new entry's rows"
        assert await recovery_writes.reappended(
            conn, tenant="default", dispatch=dispatch, entry_id=appended, carries=fence.carries
        )
    outcome = await asyncio.wait_for(start, timeout=10)
    assert (outcome.accepted, outcome.state) == (False, "done")
    qa = await grouped(engine, "WORK_STARTED", appended, "rc-1", "qa", "q-1")
    assert (qa.accepted, qa.attempt) == (True, 1)
