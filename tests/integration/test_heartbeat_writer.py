"""The heartbeat writer's group commit against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.adapters.postgres.heartbeat_writer import HeartbeatWriter
from rig_conductor.domain import AgentId, ConsumerName

from .helpers import heartbeats_stored


def beat(agent: str, n: int = 0) -> intake.HeartbeatIn:
    return intake.HeartbeatIn(AgentId(agent), ConsumerName(f"{agent}-{n}"))


class Commits:
    """The batches the writer reported committed."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def __call__(self, batch: Sequence[intake.HeartbeatIn]) -> None:
        self.batches.append([hb.consumer or "" for hb in batch])


@pytest.fixture
async def commits() -> Commits:
    return Commits()


@pytest.fixture
async def writer(
    database_url: str, engine: AsyncEngine, commits: Commits
) -> AsyncIterator[HeartbeatWriter]:
    # Listening marks every 150 s: none between a test's batches (they would find a broken
    # connection and reconnect first). tests/integration/test_blind_spells.py tests the marks.
    writer = HeartbeatWriter(database_url, tenant="default", on_commit=commits, slack_ms=600_000)
    writer.start()
    yield writer
    await writer.stop()


async def heartbeat_rows(engine: AsyncEngine) -> int:
    return await heartbeats_stored(engine)


async def test_concurrent_heartbeats_commit_together(
    writer: HeartbeatWriter, engine: AsyncEngine, commits: Commits
) -> None:
    stamps = await asyncio.gather(*(writer.submit(beat(f"agent-{i % 5}", i)) for i in range(50)))
    # All 50 were queued before the writer ran: one transaction, one receipt time.
    assert len(commits.batches) == 1 and sorted(commits.batches[0]) == sorted(
        f"agent-{i % 5}-{i}" for i in range(50)
    )
    assert len(set(stamps)) == 1
    assert await heartbeat_rows(engine) == 50


async def test_heartbeats_arriving_during_a_write_form_the_next_batch(
    writer: HeartbeatWriter, engine: AsyncEngine, commits: Commits
) -> None:
    first = asyncio.create_task(writer.submit(beat("dev-e", 0)))
    # Two turns of the loop: the writer takes the first heartbeat and starts writing it.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    later = [asyncio.create_task(writer.submit(beat("dev-e", n))) for n in range(1, 6)]
    await asyncio.gather(first, *later)
    assert [len(b) for b in commits.batches] == [1, 5]
    assert (await first) < (await later[0])
    assert await heartbeat_rows(engine) == 6


async def terminate_other_backends(engine: AsyncEngine) -> None:
    async with engine.connect() as conn:
        killed = await conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        assert any(row[0] for row in killed)


async def test_a_connection_lost_while_idle_costs_no_heartbeat(
    writer: HeartbeatWriter, engine: AsyncEngine, commits: Commits
) -> None:
    """PostgreSQL restarted (here: the writer's backend terminated) between two batches: the
    next batch finds its connection broken and is written again at once on a new one."""
    await writer.submit(beat("dev-e", 0))
    await terminate_other_backends(engine)
    await writer.submit(beat("dev-e", 1))
    assert commits.batches == [["dev-e-0"], ["dev-e-1"]]
    assert await heartbeat_rows(engine) == 2


async def test_a_database_that_cannot_be_reached_fails_the_batch(commits: Commits) -> None:
    """Nothing listens (PostgreSQL down): the batch fails once, with the connection's error
    (the API answers 503); the writer carries on (test_outage.py brings a server back)."""
    writer = HeartbeatWriter(
        "postgresql+psycopg://postgres@127.0.0.1:1/none", tenant="default", on_commit=commits
    )
    writer.start()
    try:
        for n in range(2):
            with pytest.raises(psycopg.OperationalError):
                await writer.submit(beat("dev-e", n))
    finally:
        await writer.stop()
    assert commits.batches == []


async def test_stop_writes_what_is_queued_then_refuses_more(
    writer: HeartbeatWriter, engine: AsyncEngine
) -> None:
    queued = [asyncio.create_task(writer.submit(beat("qa-e", n))) for n in range(10)]
    await asyncio.sleep(0)  # queued, not yet written
    await writer.stop()
    assert all(task.done() and task.exception() is None for task in queued)
    assert await heartbeat_rows(engine) == 10
    with pytest.raises(RuntimeError, match="not running"):
        await writer.submit(beat("qa-e", 99))


async def test_a_failing_commit_hook_does_not_fail_the_heartbeats(
    database_url: str, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(batch: Sequence[intake.HeartbeatIn]) -> None:
        raise ValueError("metrics backend exploded")

    writer = HeartbeatWriter(database_url, tenant="default", on_commit=broken)
    writer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="rig_conductor.api.ingest"):
            await asyncio.gather(*(writer.submit(beat("dev-e", n)) for n in range(3)))
    finally:
        await writer.stop()
    assert await heartbeat_rows(engine) == 3
    assert "Heartbeat commit hook failed" in caplog.text
