"""Redis restarted empty under a working fleet: a private redis-server without persistence,
`rig-conductor serve` and real `rig-conductor agent` processes. Every dispatched issue ends
completed exactly once, including one whose agent started it and was SIGKILLed before Redis
lost it, and one an agent still had in hand (its late completion is fenced off); the agents
create their vanished group again and read on. Nothing is mocked."""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, dispatches, events, redis_epochs
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    Fleet,
    accepted_completions,
    calls,
    conductor_env,
    dispatch,
    effects,
    pending,
)

from .helpers import serve, wait_for
from .restartable import RestartableRedis

# A fleet on a loaded two-core machine, a Redis restart and the agents' backoff: minutes, not
# seconds, at worst.
pytestmark = pytest.mark.timeout(300)
WITHIN = 90.0
ISSUES = [f"rc-{i}" for i in range(8)]  # rc-0: the victim's, rc-1: the holder's


async def entry_of(engine: AsyncEngine, issue: str) -> str:
    async with engine.connect() as conn:
        found = await conn.scalar(
            select(dispatches.c.entry_id).where(dispatches.c.idempotency_key == issue)
        )
    return str(found)


async def state_of(engine: AsyncEngine, entry_id: str) -> str | None:
    async with engine.connect() as conn:
        found = await conn.scalar(
            select(assignments.c.state).where(assignments.c.entry_id == entry_id)
        )
    return str(found) if found is not None else None


async def completions_by_issue(engine: AsyncEngine) -> dict[str, int]:
    """issue -> its accepted (not fenced) WORK_COMPLETED reports. A completion carried over to
    the entry that replaces a lost one (its outputs were not published yet) restates the
    accepted one: it is not counted again."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(events.c.issue_id, func.count())
            .where(
                events.c.kind == "WORK_COMPLETED",
                events.c.fenced.is_(False),
                ~events.c.detail.has_key("carriedFrom"),
            )
            .group_by(events.c.issue_id)
        )
        return {issue: int(count) for issue, count in rows}


async def carried_from(engine: AsyncEngine) -> set[str]:
    """The entries whose accepted completions were carried over to their replacements."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(events.c.detail["carriedFrom"].astext).where(
                events.c.kind == "WORK_COMPLETED", events.c.detail.has_key("carriedFrom")
            )
        )
        return {str(entry) for (entry,) in rows}


async def fenced_completions(engine: AsyncEngine, entry_id: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(events.c.consumer).where(
                events.c.kind == "WORK_COMPLETED",
                events.c.entry_id == entry_id,
                events.c.fenced.is_(True),
            )
        )
        return [str(consumer) for (consumer,) in rows]


async def test_redis_restarted_empty_loses_no_issue_and_commits_none_twice(
    restartable_redis: RestartableRedis, database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    victim_hold, holder_hold = tmp_path / "victim.hold", tmp_path / "holder.hold"
    victim_hold.touch()
    holder_hold.touch()
    env = conductor_env(["builder"])
    redis = Redis.from_url(restartable_redis.url, decode_responses=True)
    async with (
        contextlib.aclosing(redis),
        serve(restartable_redis.url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(
            restartable_redis.url, conductor.url, tmp_path, env={"E2E_OUT_DIR": str(out)}
        ) as fleet:

            async def epoch_remembered() -> bool:
                async with engine.connect() as conn:
                    return await conn.scalar(select(func.count()).select_from(redis_epochs)) == 1

            await wait_for(epoch_remembered, within=WITHIN)  # the first scan has looked

            # The victim starts rc-0 and hangs in it; the holder, rc-1 (one entry at a time, so
            # neither reads another). A worker takes the rest, a second each.
            victim = fleet.start("builder", "builder-victim", E2E_HOLD_FILE=str(victim_hold))
            await dispatch(api, "rc-0", {})
            await wait_for(lambda: (out / "holding-builder-victim").exists(), within=WITHIN)
            holder = fleet.start("builder", "builder-holder", E2E_HOLD_FILE=str(holder_hold))
            await dispatch(api, "rc-1", {})
            await wait_for(lambda: (out / "holding-builder-holder").exists(), within=WITHIN)
            worker = fleet.start("builder", "builder-w1", E2E_WORK_S="1")
            for issue in ISSUES[2:]:
                await dispatch(api, issue, {})

            async def some_done() -> bool:
                return len(await completions_by_issue(engine)) >= 2

            await wait_for(some_done, within=WITHIN)
            done_before = set(await completions_by_issue(engine))
            lost = {issue: await entry_of(engine, issue) for issue in ISSUES}
            assert await state_of(engine, lost["rc-0"]) == "running"

            # The victim dies with rc-0 started; then Redis restarts with nothing.
            victim.kill()
            restartable_redis.restart_empty()

            # The next scan appends the unfinished dispatches again and fences the lost
            # entries off; the holder's late completion is refused.
            async def fenced_off() -> bool:
                return all(
                    [
                        await state_of(engine, lost["rc-0"]) == "superseded",
                        await state_of(engine, lost["rc-1"]) == "superseded",
                    ]
                )

            await wait_for(fenced_off, within=WITHIN)
            holder_hold.unlink()
            await wait_for(lambda: fenced_completions(engine, lost["rc-1"]), within=WITHIN)
            fleet.start("builder", "builder-w2", E2E_WORK_S="0.2")

            async def all_done() -> bool:
                if set(await completions_by_issue(engine)) != set(ISSUES):
                    return False
                try:
                    return await pending(redis) == {}
                except Exception:  # the group is not there again yet
                    return False

            await wait_for(all_done, within=WITHIN)

            # Every issue completed exactly once.
            assert await completions_by_issue(engine) == dict.fromkeys(ISSUES, 1)
            assert await fenced_completions(engine, lost["rc-1"]) == ["builder-holder"]
            assert "fenced at completion" in holder.output()
            # The lost entries were replaced, and their effects come from the new entries: the
            # holder's staged file was discarded, the victim's never written.
            made = effects(out)
            assert sorted(made) == ISSUES
            for issue in ("rc-0", "rc-1"):
                now = await entry_of(engine, issue)
                assert now != lost[issue] and made[issue]["entryId"] == now
            # Finished before the restart: not run again. Run twice: only what was in hand.
            runs = {issue: len(calls(out, issue)) for issue in ISSUES}
            assert all(runs[issue] == 1 for issue in done_before), runs
            # (A marker names issue, consumer and attempt: the holder running rc-1's new entry
            # itself leaves one marker for both runs.)
            assert max(runs.values()) <= 2 and runs["rc-0"] == 2, runs
            assert sum(count == 2 for count in runs.values()) <= 3, runs  # + the worker's
            # Each completion that counts is of the entry the issue is recorded as now (one
            # accepted just before Redis lost it is carried over to that entry).
            accepted = set(await accepted_completions(engine)) - await carried_from(engine)
            assert accepted == {await entry_of(engine, issue) for issue in ISSUES}
            # The agents made their group again (whichever read first after Redis came back
            # empty) and read on; the conductor said what happened.
            assert "is gone" in worker.output() + holder.output()

            async def rejoined() -> bool:
                consumers = {c["name"] for c in await redis.xinfo_consumers(STREAM, GROUP)}
                return {"builder-holder", "builder-w1", "builder-w2"} <= consumers

            await wait_for(rejoined, within=WITHIN)
            assert "Redis lost its data" in conductor.stderr
