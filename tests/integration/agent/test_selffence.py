"""The runtime's side of rules 3b and 4b, against a real conductor, Redis and PostgreSQL:
`Degraded` pauses all reading and flags the heartbeats; `entry.progress()` keeps an entry;
a handler past RIG_ENTRY_DEADLINE_MS without progress is abandoned, and its attempt fenced."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.agent import Degraded, Entry, Fenced
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import AGENT, ME, G, S, assignment, dispatch, pending, running, work_events


async def agent_view(conductor: str) -> dict[str, object]:
    async with httpx.AsyncClient(base_url=conductor) as api:
        [agent] = [a for a in (await api.get("/api/agents")).json() if a["agentId"] == AGENT]
    return dict(agent)


async def test_degraded_pauses_all_reading_and_flags_the_heartbeats(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
) -> None:
    calls: list[tuple[str, float]] = []
    pause_ends: list[float] = []  # time.monotonic() at `until`

    def handler(entry: Entry) -> None:
        calls.append((entry.id, time.monotonic()))
        if len(calls) == 1:
            pause_ends.append(time.monotonic() + 2.0)
            raise Degraded("codex_quota", until=datetime.now(UTC) + timedelta(seconds=2.0))

    first = await dispatch(conductor, "rc-1")
    async with running(handler, settings()):
        await wait_for(lambda: len(calls) == 1)

        async def flagged() -> bool:
            # The degraded heartbeat goes out right after the failed call's WORK_FAILED.
            view = await agent_view(conductor)
            return bool(view["degraded"]) and view["degradedReasons"] == ["codex_quota"]

        await wait_for(flagged)
        second = await dispatch(conductor, "rc-2")

        async def story() -> str:
            return (
                f"calls {[entry for entry, _ in calls]}, pending {await pending(redis)}, "
                f"first {await work_events(engine, first)}, "
                f"second {await work_events(engine, second)}"
            )

        await wait_for(lambda: len(calls) == 3, explain=story)
        # Self-fenced: neither the failed entry nor the new one was read before the pause
        # ended; then its own pending entries first, then new ones.
        assert [entry for entry, _ in calls] == [first, first, second]
        assert all(at >= pause_ends[0] - 0.05 for _, at in calls[1:])
        await wait_for(lambda: _healthy(conductor))


async def _healthy(conductor: str) -> bool:
    return (await agent_view(conductor))["degraded"] is False


async def test_progress_keeps_an_entry_past_its_deadline(
    redis: Redis, engine: AsyncEngine, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    # The work lasts twice the deadline, in slices far inside it: on a loaded machine a
    # progress report's round trip alone may take most of a second.
    deadline_s = 2.5
    reports: list[float] = []

    def handler(entry: Entry) -> None:
        started = time.monotonic()
        while time.monotonic() - started < 2 * deadline_s:
            time.sleep(0.2)  # a slice of the work
            entry.progress()
            reports.append(time.monotonic() - started)

    entry_id = await dispatch(conductor, "rc-3")
    async with running(handler, settings(entry_deadline_ms=int(deadline_s * 1000))):
        await wait_for(lambda: _state(engine, entry_id, "done"), within=30)
    kinds = [kind for kind, _, fenced, _ in await work_events(engine, entry_id) if not fenced]
    assert kinds[0] == "WORK_STARTED" and kinds[-1] == "WORK_COMPLETED"
    assert reports[-1] >= 2 * deadline_s  # it did outlive its deadline
    assert kinds.count("WORK_PROGRESS") == len(reports)


async def _state(engine: AsyncEngine, entry_id: str, state: str) -> bool:
    row = await assignment(engine, entry_id)
    return row is not None and row[0] == state


async def test_a_hung_sync_handler_is_abandoned_and_its_late_progress_fenced(
    redis: Redis, engine: AsyncEngine, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    release = threading.Event()
    seen: list[str] = []
    late: list[BaseException] = []

    def handler(entry: Entry) -> None:
        seen.append(entry.id)
        if entry.fields["issueId"] == "rc-hung":
            release.wait(30)
            try:
                entry.progress()
            except Fenced as exc:
                late.append(exc)

    hung = await dispatch(conductor, "rc-hung")
    async with running(handler, settings(entry_deadline_ms=500, scan_interval_s=0.3)):
        await wait_for(lambda: _failed_with(engine, hung, "abandoned"))
        other = await dispatch(conductor, "rc-next")
        await wait_for(lambda: _state(engine, other, "done"))  # it reads on
        await asyncio.sleep(0.8)  # two reads of its own pending list
        assert seen.count(hung) == 1  # never run again here
        # Left for the reaper, and not even read again: a read would wear it out.
        assert (await pending(redis, ME))[hung] == 1
        release.set()
        await wait_for(lambda: bool(late))
    assert isinstance(late[0], Fenced)


async def _failed_with(engine: AsyncEngine, entry_id: str, text: str) -> bool:
    return any(
        kind == "WORK_FAILED" and text in str(detail)
        for kind, _, _, detail in await work_events(engine, entry_id)
    )


async def test_a_hung_async_handler_is_cancelled_at_the_deadline(
    engine: AsyncEngine, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    cancelled = asyncio.Event()

    async def handler(entry: Entry) -> None:
        try:
            await asyncio.sleep(3600)  # hangs until the deadline cancels it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    entry_id = await dispatch(conductor, "rc-async")
    async with running(handler, settings(entry_deadline_ms=400)):
        await asyncio.wait_for(cancelled.wait(), 10)
        await wait_for(lambda: _failed_with(engine, entry_id, "abandoned"))


async def test_progress_after_a_reclaim_raises_fenced_in_the_handler(
    engine: AsyncEngine, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    reported, moved = threading.Event(), threading.Event()
    outcome: list[str] = []

    async def handler(entry: Entry) -> None:
        await entry.progress()
        reported.set()
        await asyncio.get_running_loop().run_in_executor(None, moved.wait, 60)
        # A report the conductor could not answer in time (a loaded machine) is not recorded
        # and fences nothing: report again until the answer comes.
        while True:
            try:
                await entry.progress()
            except Fenced:
                outcome.append("fenced")
                raise
            await asyncio.sleep(0.2)

    entry_id = await dispatch(conductor, "rc-moved")
    async with running(handler, settings()):
        await wait_for(lambda: _state(engine, entry_id, "running"), within=60)
        # Moved only once the first report is answered: on a loaded machine that report could
        # still be on its way, and would be fenced itself, outside the loop that expects it.
        await wait_for(reported.is_set, within=60)
        # The reaper moved it elsewhere: a new attempt is reserved for the target.
        await pg_writes.reclaimed(
            engine,
            tenant="default",
            stream=S,
            group=G,
            consumer="dev-e-agent-1",
            entry_ids=[entry_id],
        )
        moved.set()
        await wait_for(lambda: outcome == ["fenced"], within=60)
