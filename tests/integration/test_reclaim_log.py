"""The on-call log at scan speed, as users run it: `rig-conductor reap --once` at INFO with
stderr read through a pipe. One line per moved entry in text and JSON, none lost, cut or out of
order at 200,000 entries; a closed stderr neither fails the scan nor loses event-log rows."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import AgentId, ConsumerName

from .helpers import idle_at_least

S, G = "rig:dispatch", "g"
ENTRIES, DEAD = 200_000, 200
LINE = re.compile(r"^\S+ \S+ INFO    rig_conductor\.reaper\.cycle: \[StreamReclaim\] Reclaimed ")

pytestmark = pytest.mark.timeout(300)


async def plant(redis: Redis, engine: AsyncEngine) -> None:
    """ENTRIES pending entries over DEAD consumers of a dead agent; one live consumer."""
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    for start in range(0, ENTRIES, 10_000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, start + 10_000):
                pipe.xadd(S, {"issueId": f"rc-{i}"}, id=f"{i + 1}-0")
            await pipe.execute()
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(DEAD):
            pipe.xreadgroup(G, f"dev-e-{n}", {S: ">"}, count=ENTRIES // DEAD)
        await pipe.execute()
    await redis.xgroup_createconsumer(S, G, "qa-e-0")
    live = [intake.HeartbeatIn(AgentId("qa-e"), ConsumerName("qa-e-0"))]
    await intake.record_heartbeats(engine, tenant="default", heartbeats=live)
    # Past RIG_ENTRY_STALE_MS (100) since the last delivery: reading all 200 000 pending rows
    # to see it would take longer than the wait.
    await asyncio.sleep(0.15)


def reap(env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    return subprocess.run(
        [sys.executable, "-m", "rig_conductor", "reap", "--once"],
        env={**clean, **env},
        text=True,
        timeout=240,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.fixture
def env(redis_url: str, database_url: str) -> dict[str, str]:
    return {
        "RIG_REDIS_URL": redis_url,
        "RIG_DATABASE_URL": database_url,
        "RIG_STREAMS": S,
        "RIG_AGENT_IDS": "dev-e,qa-e",
        "RIG_ENTRY_STALE_MS": "100",
    }


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_every_move_is_one_whole_line_in_order(
    log_format: str, redis: Redis, engine: AsyncEngine, env: dict[str, str]
) -> None:
    await plant(redis, engine)
    done = await asyncio.to_thread(reap, {**env, "RIG_LOG_FORMAT": log_format}, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["reclaimed"] == ENTRIES
    if log_format == "json":
        records = [json.loads(line) for line in done.stderr.splitlines()]  # every line whole
        moves = [r for r in records if r["message"].startswith("[StreamReclaim] Reclaimed")]
        assert all(r["reason"] == "down" and r["toConsumer"] == "qa-e-0" for r in moves)
        ids = [r["entryId"] for r in moves]
        assert all(r["message"].endswith(" -> qa-e-0") for r in moves)
    else:
        moves_text = [line for line in done.stderr.splitlines() if "Reclaimed" in line]
        assert all(LINE.match(line) for line in moves_text)
        ids = [line.split("Reclaimed ")[1].split(" on ")[0] for line in moves_text]
    assert len(ids) == ENTRIES and len(set(ids)) == ENTRIES
    # In order: owner by owner, each owner's entries by id.
    per_owner: dict[int, list[int]] = {}
    for entry_id in ids:
        n = int(entry_id.split("-")[0]) - 1
        per_owner.setdefault(n // (ENTRIES // DEAD), []).append(n)
    assert all(numbers == sorted(numbers) for numbers in per_owner.values())


async def recorded(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        moved = await conn.execute(
            select(func.sum(func.cardinality(events.c.entry_ids))).where(
                events.c.kind == "RECLAIMED"
            )
        )
        return int(moved.scalar_one() or 0)


async def test_a_closed_stderr_neither_fails_the_scan_nor_loses_event_rows(
    redis: Redis, engine: AsyncEngine, env: dict[str, str]
) -> None:
    await plant(redis, engine)
    # As `2>&-` in a shell: the process starts with no file descriptor 2 at all.
    done = await asyncio.to_thread(
        reap, env, stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2)
    )
    assert done.returncode == 0
    assert json.loads(done.stdout)["reclaimed"] == ENTRIES
    assert await recorded(engine) == ENTRIES


async def test_a_full_stderr_pipe_neither_stalls_the_scan_nor_loses_event_rows(
    redis: Redis, engine: AsyncEngine, env: dict[str, str]
) -> None:
    await plant(redis, engine)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    # stderr is a pipe nobody reads: it fills after 64 KiB, about 500 of the 200,000 lines.
    process = subprocess.Popen(  # noqa: ASYNC220 - read below in a thread
        [sys.executable, "-m", "rig_conductor", "reap", "--once"],
        env={**clean, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        report = await asyncio.wait_for(asyncio.to_thread(process.stdout.read), 120)
        code = await asyncio.wait_for(asyncio.to_thread(process.wait), 60)
    finally:
        process.kill()
        process.communicate()
    assert code == 0
    assert json.loads(report)["reclaimed"] == ENTRIES
    assert await recorded(engine) == ENTRIES


FORGED = "\n2026-11-26 10:00:00,000 INFO    rig_conductor.reaper.cycle: [StreamReclaim] Reclaimed"


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_newline_in_a_consumer_name_forges_no_line(
    log_format: str, redis: Redis, engine: AsyncEngine, env: dict[str, str]
) -> None:
    """Anyone who may XREADGROUP names consumers: the name is quoted, never a line of its own."""
    evil = "dev-e-0" + FORGED + " 1-0 on rig:dispatch: x -> y\x1b[2K\u2028"
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    for i in range(3):
        await redis.xadd(S, {"issueId": f"rc-{i}"})
    await redis.xreadgroup(G, evil, {S: ">"}, count=3)
    await redis.xgroup_createconsumer(S, G, "qa-e-0")
    live = [intake.HeartbeatIn(AgentId("qa-e"), ConsumerName("qa-e-0"))]
    await intake.record_heartbeats(engine, tenant="default", heartbeats=live)
    await idle_at_least(redis, S, G, 100)  # RIG_ENTRY_STALE_MS
    done = await asyncio.to_thread(reap, {**env, "RIG_LOG_FORMAT": log_format}, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["reclaimed"] == 3
    lines = done.stderr.splitlines()  # splits on \x85 and U+2028 too
    if log_format == "json":
        moves = [json.loads(line) for line in lines if "[StreamReclaim]" in line]
        assert [m["fromConsumer"] for m in moves] == [evil] * 3
    else:
        moves = [line for line in lines if "[StreamReclaim]" in line]
        assert len(moves) == 3 and all(LINE.match(line) for line in moves)
        assert all(r" on rig:dispatch: dev-e-0\n2026-11-26 " in line for line in moves)
        assert all(line.endswith(r"x -> y\x1b[2K\u2028 -> qa-e-0") for line in moves)
