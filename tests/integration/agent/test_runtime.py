"""The agent runtime against a real Redis, a real PostgreSQL and a real conductor (uvicorn,
in-process). Agents run in-process, or as real processes where signals and exit codes matter."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.agent import Entry, staging
from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.lease import lease_key
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import (
    AGENT,
    ME,
    G,
    S,
    agent_of,
    assignment,
    back_to_me,
    delivered_to_me,
    dispatch,
    drained,
    group_exists,
    heard_from,
    leftovers,
    old_owner,
    pending,
    post,
    published,
    running,
    work_events,
)


async def test_group_is_created_lazily_and_the_consumer_registered_before_any_read(
    redis: Redis, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "rc-0"})
    client = ConductorClient(base_url=conductor, agent_id=AGENT, consumer=ME)
    agent = agent_of(lambda entry: None, settings(), redis=redis, conductor=client, start_id="$")
    try:
        await agent._join_group()  # what run() does first, before reading
        await agent._join_group()  # BUSYGROUP the second time: fine
    finally:
        await client.aclose()
    (group,) = await redis.xinfo_groups(S)
    assert group["name"] == G
    assert group["last-delivered-id"] == (await redis.xinfo_stream(S))["last-generated-id"]
    consumers = await redis.xinfo_consumers(S, G)
    assert [c["name"] for c in consumers] == [ME]
    assert consumers[0]["pending"] == 0

    # And with no stream at all, MKSTREAM creates it; start id 0 by default.
    await redis.delete(S)
    async with running(lambda entry: None, settings()):
        await wait_for(lambda: redis.exists(S))
        await wait_for(lambda: redis.xinfo_consumers(S, G))
    assert [c["name"] for c in await redis.xinfo_consumers(S, G)] == [ME]


async def test_an_entry_is_started_handled_completed_and_acked(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    seen: list[Entry] = []

    def handle(entry: Entry) -> None:  # sync: runs in a thread
        seen.append(entry)
        entry.stage(tmp_path / "out" / f"{entry.fields['issueId']}.txt").write_text("built")

    entry_id = await dispatch(conductor, "rc-1")
    async with running(handle, settings()):
        await wait_for(lambda: assignment(engine, entry_id))
        await wait_for(lambda: (tmp_path / "out" / "rc-1.txt").exists())
        await wait_for(lambda: drained(redis))
    (entry,) = seen
    assert (entry.id, entry.stream, entry.group, entry.consumer, entry.attempt) == (
        entry_id,
        S,
        G,
        ME,
        1,
    )
    assert entry.fields["issueId"] == "rc-1" and entry.issue_id == "rc-1"
    assert (tmp_path / "out" / "rc-1.txt").read_text() == "built"
    assert leftovers(tmp_path) == []
    assert await assignment(engine, entry_id) == ("done", 1)
    kinds = [
        (kind, attempt, fenced) for kind, attempt, fenced, _ in await work_events(engine, entry_id)
    ]
    assert kinds == [
        ("WORK_STARTED", 1, False),
        ("WORK_COMPLETED", 1, False),
        ("WORK_PUBLISHED", 1, False),
    ]
    assert await published(engine, entry_id) is True


async def test_a_handler_that_raises_leaves_the_entry_pending_and_reports_work_failed(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    async def handle(entry: Entry) -> None:  # async handler
        entry.stage(tmp_path / "half.txt").write_text("half")
        raise ValueError("the build broke")

    entry_id = await dispatch(conductor, "rc-2")
    async with running(handle, settings()):

        async def failed() -> bool:
            return any(kind == "WORK_FAILED" for kind, *_ in await work_events(engine, entry_id))

        await wait_for(failed)
    assert await pending(redis, ME) == {entry_id: 1}
    assert await assignment(engine, entry_id) == ("failed", 1)
    *_, (kind, attempt, fenced, detail) = await work_events(engine, entry_id)
    assert (kind, attempt, fenced) == ("WORK_FAILED", 1, False)
    assert detail == {"error": "ValueError: the build broke"}
    assert not (tmp_path / "half.txt").exists() and leftovers(tmp_path) == []


async def test_an_entry_reclaimed_into_its_pending_list_is_picked_up_by_the_periodic_read(
    redis: Redis, engine: AsyncEngine, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    handled: list[str] = []
    # A consumer that died holding an entry: the reaper will move it to the agent.
    second = await dispatch(conductor, "rc-4")
    await group_exists(redis)
    await redis.xreadgroup(G, "qa-e-dead", {S: ">"}, count=1)
    async with running(lambda entry: handled.append(entry.id), settings(scan_interval_s=1.0)):
        first = await dispatch(conductor, "rc-3")
        await wait_for(lambda: handled == [first])  # read as new: the start-up pass is over
        await redis.xclaim(S, G, ME, min_idle_time=0, message_ids=[second], justid=True)
        await wait_for(lambda: handled == [first, second], within=10)
        await wait_for(lambda: drained(redis))
    assert await assignment(engine, second) == ("done", 1)


async def test_a_worn_out_entry_is_dead_lettered_like_the_reaper_does_and_not_handled(
    redis: Redis, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    handled: list[str] = []
    worn = await dispatch(conductor, "rc-5")
    twin = await dispatch(conductor, "rc-6")
    await group_exists(redis)
    # Two deliveries each (RIG_MAX_DELIVERIES=2): `worn` sits with the agent, `twin` with a dead
    # consumer of an agent that never heartbeats, for the reaper.
    await redis.xreadgroup(G, "qa-e-dead", {S: ">"}, count=2)
    await redis.xreadgroup(G, "qa-e-dead", {S: "0"}, count=2)
    await redis.xclaim(S, G, ME, min_idle_time=0, message_ids=[worn], justid=True)
    assert await pending(redis) == {worn: 2, twin: 2}

    async with running(lambda entry: handled.append(entry.id), settings()):
        await wait_for(lambda: redis.xlen(f"{S}:dlq"))
        await wait_for(lambda: heard_from(conductor, ME))  # the reaper's target
        async with httpx.AsyncClient(base_url=conductor) as api:
            report = (await api.post("/api/reaper/scan", params={"dryRun": "false"})).json()
        assert report["deadLettered"] == 1
    assert handled == []
    assert await pending(redis) == {}
    by_agent, by_reaper = [fields for _, fields in await redis.xrange(f"{S}:dlq")]
    assert by_agent["originalId"] == worn and by_reaper["originalId"] == twin
    assert set(by_agent) == set(by_reaper)
    assert by_agent["reason"] == by_reaper["reason"] == "max-deliveries"
    assert (by_agent["stream"], by_agent["group"], by_agent["consumer"]) == (S, G, ME)
    assert by_agent["deliveries"] == "3"  # the two before, and the read that found it worn out
    assert by_agent["issueId"] == "rc-5" and by_agent["type"] == "ISSUE_ASSIGNED"


async def test_a_trimmed_entry_is_dead_lettered_with_reason_trimmed(
    redis: Redis, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    handled: list[str] = []
    gone = await delivered_to_me(conductor, redis, "rc-7")
    await redis.xdel(S, gone)
    async with running(lambda entry: handled.append(entry.id), settings()):
        await wait_for(lambda: redis.xlen(f"{S}:dlq"))
    assert handled == []
    assert await pending(redis) == {}
    ((_, fields),) = await redis.xrange(f"{S}:dlq")
    assert fields["originalId"] == gone and fields["consumer"] == ME
    assert fields["reason"].startswith("trimmed")


async def test_a_fenced_completion_neither_renames_nor_acks(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    inside, release = asyncio.Event(), asyncio.Event()
    final = tmp_path / "report.txt"

    async def handle(entry: Entry) -> None:
        entry.stage(final).write_text(f"attempt {entry.attempt}")
        inside.set()
        await release.wait()

    entry_id = await dispatch(conductor, "rc-8")
    async with running(handle, settings()):
        await asyncio.wait_for(inside.wait(), 10)
        # Meanwhile the entry is reclaimed to another consumer, which starts a newer attempt.
        await redis.xclaim(S, G, "qa-e-0", 0, [entry_id], justid=True)
        await pg_writes.reclaimed(
            engine, tenant="default", stream=S, group=G, consumer="qa-e-0", entry_ids=[entry_id]
        )
        newer = await post(
            conductor,
            type="WORK_STARTED",
            agentId="qa-e",
            consumer="qa-e-0",
            stream=S,
            entryId=entry_id,
        )
        assert newer.json() == {"attempt": 2}
        release.set()

        async def fenced() -> bool:
            return any(f for kind, _, f, _ in await work_events(engine, entry_id))

        await wait_for(fenced)
        # Answered "fenced", the runtime discards the staged file: stopping before then would
        # cut the answer short and leave it staged.
        await wait_for(lambda: leftovers(tmp_path) == [])
    assert not final.exists() and leftovers(tmp_path) == []
    # Not acked: an XACK would have taken the entry from the group, the new owner's list too.
    assert await pending(redis) == {entry_id: 1}
    assert await pending(redis, ME) == {}
    assert await assignment(engine, entry_id) == ("running", 2)
    assert (await work_events(engine, entry_id))[-1][:3] == ("WORK_COMPLETED", 1, True)


async def test_a_commit_interrupted_after_acceptance_is_finished_by_the_next_runtime(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    """A process got its WORK_COMPLETED (with its staged outputs) accepted and died before
    renaming; an older attempt also left its staged file behind. The runtime that holds the
    entry next is told the outputs in the 409 to its WORK_STARTED: it publishes the accepted
    attempt's file, removes the other, reports WORK_PUBLISHED and acks, without running the
    handler."""
    handled: list[str] = []
    final = tmp_path / "result.txt"
    entry_id = await delivered_to_me(conductor, redis, "rc-9")
    report = await old_owner(redis, entry_id)
    for attempt in (1, 2):
        started = await post(conductor, type="WORK_STARTED", **report)
        assert started.json() == {"attempt": attempt}
        tmp = staging.temp_path(final, entry_id=entry_id, attempt=attempt)
        tmp.write_text(f"attempt {attempt}")
        files = (staging.StagedFile(tmp, final),)
    outputs = [{"staged": str(tmp), "path": str(final)}]
    accepted = await post(conductor, type="WORK_COMPLETED", attempt=2, outputs=outputs, **report)
    assert accepted.status_code == 202
    assert not final.exists()
    assert await published(engine, entry_id) is False

    await back_to_me(redis, entry_id)
    async with running(lambda entry: handled.append(entry.id), settings()):
        await wait_for(lambda: drained(redis))
    assert handled == []
    assert final.read_text() == "attempt 2"
    assert leftovers(tmp_path) == []
    assert await assignment(engine, entry_id) == ("done", 2)
    assert await published(engine, entry_id) is True
    kinds = [(kind, attempt) for kind, attempt, _, _ in await work_events(engine, entry_id)]
    assert kinds[-1] == ("WORK_PUBLISHED", 2)

    # Idempotent: a second recovery of the same commit changes nothing.
    assert staging.commit(files) == staging.Committed(already=1)


async def test_an_attempt_killed_before_its_intent_leaves_no_temporary_file(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    """Attempt 1's process staged a file and died inside its handler, before it recorded an
    intent; attempt 2 completes the entry and removes what attempt 1 left."""
    final = tmp_path / "out" / "rc-11.txt"
    entry_id = await delivered_to_me(conductor, redis, "rc-11")
    report = await old_owner(redis, entry_id)
    started = await post(conductor, type="WORK_STARTED", **report)
    assert started.json() == {"attempt": 1}
    final.parent.mkdir()
    staging.temp_path(final, entry_id=entry_id, attempt=1).write_text("half written")

    def handle(entry: Entry) -> None:
        entry.stage(final).write_text(f"attempt {entry.attempt}")

    await back_to_me(redis, entry_id)
    async with running(handle, settings()):
        await wait_for(lambda: drained(redis))
    assert final.read_text() == "attempt 2"
    assert leftovers(tmp_path) == []
    assert await assignment(engine, entry_id) == ("done", 2)


async def test_a_dead_predecessors_lease_is_waited_out(
    redis: Redis, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    handled: list[str] = []
    entry_id = await dispatch(conductor, "rc-10")
    await redis.set(lease_key(AGENT, S, G, ME), "crashed-instance", px=800)
    async with running(lambda entry: handled.append(entry.id), settings()):
        await wait_for(lambda: handled == [entry_id])
        assert await redis.get(lease_key(AGENT, S, G, ME)) not in (None, "crashed-instance")
    assert await redis.get(lease_key(AGENT, S, G, ME)) is None  # released on a clean stop


# Real processes: exit codes, signals, two processes with one CONSUMER_ID.

HANDLERS = """
import pathlib, time

def slow(entry):
    out = pathlib.Path(__file__).parent
    (out / f"started-{entry.fields['issueId']}").write_text(str(entry.attempt))
    time.sleep(1.5)  # long enough for a signal to arrive while it works
    entry.stage(out / f"done-{entry.fields['issueId']}.txt").write_text("finished")
"""


def spawn(
    redis_url: str, conductor: str, cwd: Path, consumer: str, **env: str
) -> subprocess.Popen[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(
        RIG_REDIS_URL=redis_url,
        RIG_CONDUCTOR_URL=conductor,
        RIG_HEARTBEAT_INTERVAL_S="0.3",
        RIG_SCAN_INTERVAL_S="60",
        CONSUMER_ID=consumer,
        **env,
    )
    module = (cwd / "handlers.py").name.removesuffix(".py")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rig_conductor.agent.cli",
            "--agent-id",
            AGENT,
            "--group",
            G,
            "--stream",
            S,
            "--handler",
            f"{module}:slow",
        ],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def finish(process: subprocess.Popen[str], within: float = 20) -> tuple[int, str]:
    """Its exit code and stderr; killed (and the test failed) if it has not exited in time, so
    no process outlives its test."""
    try:
        _, stderr = await asyncio.to_thread(process.communicate, timeout=within)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = await asyncio.to_thread(process.communicate)
        raise AssertionError(f"the agent did not exit within {within}s: {stderr[-2000:]}") from None
    return process.returncode, stderr


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "handlers.py").write_text(textwrap.dedent(HANDLERS))
    return tmp_path


async def test_a_second_process_with_the_same_consumer_id_is_refused(
    redis: Redis, redis_url: str, conductor: str, workdir: Path
) -> None:
    name = f"dev-e-{uuid.uuid4().hex[:6]}"
    first = spawn(redis_url, conductor, workdir, name)
    try:
        await wait_for(lambda: redis.exists(lease_key(AGENT, S, G, name)), within=20)
        second = spawn(redis_url, conductor, workdir, name)
        code, stderr = await finish(second)
        assert code == 2, stderr
        assert "consumer name in use by another live process" in stderr
        assert "Traceback" not in stderr
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        code, stderr = await finish(first)
    assert code == 0, stderr


async def test_sigterm_finishes_the_current_entry_and_exits_0(
    redis: Redis, engine: AsyncEngine, redis_url: str, conductor: str, workdir: Path
) -> None:
    entry_id = await dispatch(conductor, "rc-11")
    agent = spawn(redis_url, conductor, workdir, "dev-e-sigterm")
    try:
        await wait_for(lambda: (workdir / "started-rc-11").exists(), within=20)
    finally:
        agent.send_signal(signal.SIGTERM)
        code, stderr = await finish(agent)
    assert code == 0, stderr
    assert (workdir / "done-rc-11.txt").read_text() == "finished"
    assert await pending(redis) == {}
    assert await assignment(engine, entry_id) == ("done", 1)
    assert f"Entry {entry_id} (issue rc-11, attempt 1): completed" in stderr
    assert "SIGTERM received" in stderr and "Traceback" not in stderr


async def test_nothing_is_read_before_the_conductor_accepts_a_heartbeat(
    redis: Redis, settings: Callable[..., AgentSettings], caplog: pytest.LogCaptureFixture
) -> None:
    # A consumer that held entries without ever heartbeating by name could never be judged down.
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "rc-0"})
    handled: list[str] = []
    with caplog.at_level("WARNING", logger="rig_conductor.agent"):
        async with running(
            lambda entry: handled.append(entry.id), settings(conductor_url="http://127.0.0.1:1")
        ):
            await wait_for(lambda: "reading nothing until the conductor accepts one" in caplog.text)
            await asyncio.sleep(1.5)  # heartbeats still failing: time for a read it must not make
            assert (await redis.xpending(S, G))["pending"] == 0
    assert handled == []
    assert "reading nothing until the conductor accepts one" in caplog.text


class _SwallowsOneCancel(ConductorClient):
    """A conductor client whose third heartbeat hangs and swallows the cancellation that ends
    it, as a cancel scope racing a heartbeat's deadline can; every other heartbeat is real."""

    def __init__(self, stop: asyncio.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stop = stop
        self.beats = 0
        self.swallowed = False

    async def heartbeat(self, *, degraded: bool = False, reasons: Sequence[str] = ()) -> None:
        self.beats += 1
        if self.beats != 3:
            await super().heartbeat(degraded=degraded, reasons=reasons)
            return
        self.stop.set()  # a stop arrives while this heartbeat is in flight
        try:
            await asyncio.sleep(60)  # hangs until the shutdown cancels it
        except asyncio.CancelledError:
            self.swallowed = True
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()


async def test_the_heartbeat_loop_ends_even_when_its_cancellation_is_swallowed(
    redis: Redis, settings: Callable[..., AgentSettings], conductor: str
) -> None:
    stop = asyncio.Event()
    client = _SwallowsOneCancel(stop, base_url=conductor, agent_id=AGENT, consumer=ME)
    # A heartbeat's deadline is its interval: long enough here for shutdown's cancel to land
    # inside the hanging heartbeat rather than its deadline.
    agent = agent_of(
        lambda entry: None,
        settings(heartbeat_interval_s=3),
        redis=redis,
        conductor=client,
        stop=stop,
        block_ms=100,
    )
    try:
        await asyncio.wait_for(agent.run(), 30)
    finally:
        await client.aclose()
    assert client.swallowed
    beats = client.beats
    await asyncio.sleep(3.5)  # past the heartbeat interval of 3 s
    assert client.beats == beats  # and nothing beats on after run() returned
