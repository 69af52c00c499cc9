"""Migration 0019 against a real PostgreSQL: the heartbeat function keeps its signature, rule 3b's
runs survive the upgrade and the downgrade, and `degraded_since`, which the previous release
reads, is written as migration 0014's function wrote it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake, migrations, queries
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy import degraded
from tests.integration.helpers import database_at, engine_on

BEFORE = "0018"  # the revision before the one under test: 0014's function
AGENT, CODEX, CLAUDE = "review-e-codex", "review-e-codex-0", "review-e-codex-1"
SIGNATURE = ("p_tenant text, p_batch jsonb, p_break interval", "timestamp with time zone")
NEW_COLUMNS = {
    ("agent_heartbeats", "anonymous_at"),
    ("agent_heartbeats", "anonymous_degraded"),
    ("agent_heartbeats", "anonymous_since"),
    ("consumer_heartbeats", "status_since"),
}

Beat = tuple[str, str | None, bool]


@pytest.fixture
def old_url(database_url: str) -> Iterator[str]:
    """A database of its own, migrated to the revision before 0019."""
    with database_at(database_url, "rig_migrate", BEFORE) as url:
        yield url


@pytest.fixture
def head_url(database_url: str) -> Iterator[str]:
    """A second database of its own, migrated to head."""
    with database_at(database_url, "rig_migrate", "head") as url:
        yield url


@pytest.fixture
async def old(old_url: str) -> AsyncIterator[AsyncEngine]:
    async with engine_on(old_url) as engine:
        yield engine


@pytest.fixture
async def head(head_url: str) -> AsyncIterator[AsyncEngine]:
    async with engine_on(head_url) as engine:
        yield engine


async def beat(engine: AsyncEngine, *beats: Beat) -> datetime:
    return await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[
            intake.HeartbeatIn(AgentId(a), ConsumerName(c) if c else None, d) for a, c, d in beats
        ],
        break_ms=60_000,
    )


async def function_signature(engine: AsyncEngine) -> list[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT pg_get_function_identity_arguments(oid), pg_get_function_result(oid)"
                " FROM pg_proc WHERE proname = 'rig_record_heartbeats'"
            )
        )
        return [(args, result) for args, result in rows]


async def new_columns(engine: AsyncEngine) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_name IN ('agent_heartbeats', 'consumer_heartbeats')"
            )
        )
        return {(table, column) for table, column in rows} & NEW_COLUMNS


async def runs(engine: AsyncEngine) -> tuple[datetime | None, datetime | None, datetime | None]:
    """Rule 3b's run start as policy decides it: the agent's (for its consumers that never
    heartbeat by name), CODEX's and CLAUDE's."""
    evidence = await queries.load_evidence(
        engine, tenant="default", configured_agents=(), down_ms=60_000
    )
    own = evidence.consumer_heartbeats
    return (
        degraded.run_start(None, evidence.agent_heartbeats.get(AgentId(AGENT))),
        degraded.run_start(own.get(ConsumerName(CODEX)), None),
        degraded.run_start(own.get(ConsumerName(CLAUDE)), None),
    )


async def degraded_since(engine: AsyncEngine) -> dict[str, datetime | None]:
    """The `degraded_since` column, per agent and per consumer, as the previous release reads."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT agent_id, degraded_since FROM agent_heartbeats UNION ALL"
                " SELECT consumer, degraded_since FROM consumer_heartbeats"
            )
        )
        return {key: since for key, since in rows}


async def test_upgrade_and_downgrade_keep_the_function_and_the_runs(
    old: AsyncEngine, old_url: str
) -> None:
    config = migrations.alembic_config(old_url)
    assert await function_signature(old) == [SIGNATURE]
    first = await beat(old, (AGENT, None, True), (AGENT, CODEX, True), (AGENT, CLAUDE, False))
    await beat(old, (AGENT, None, True), (AGENT, CODEX, True), (AGENT, CLAUDE, False))

    # Up: the same function by signature (the previous release's intake calls it unchanged),
    # and the runs begun before go on from their first heartbeat.
    await asyncio.to_thread(command.upgrade, config, "head")
    assert await function_signature(old) == [SIGNATURE]
    assert await new_columns(old) == NEW_COLUMNS
    assert await runs(old) == (first, first, None)
    sick = await beat(old, (AGENT, None, True), (AGENT, CODEX, True), (AGENT, CLAUDE, True))
    await beat(old, (AGENT, CLAUDE, True))
    assert await runs(old) == (first, first, sick)

    # Down: 0014's function again, carrying on from `degraded_since` as 0019 kept it.
    await asyncio.to_thread(command.downgrade, config, BEFORE)
    assert await function_signature(old) == [SIGNATURE]
    assert await new_columns(old) == set()
    async with old.connect() as conn:
        body = (
            await conn.execute(
                text("SELECT prosrc FROM pg_proc WHERE proname = :f"),
                {"f": "rig_record_heartbeats"},
            )
        ).scalar_one()
    assert "status_since" not in body and "anonymous_all_degraded" in body
    assert (await degraded_since(old))[AGENT] == first
    await beat(old, (AGENT, None, True), (AGENT, CODEX, True), (AGENT, CLAUDE, True))
    assert await degraded_since(old) == {AGENT: first, CODEX: first, CLAUDE: sick}

    # And up again.
    await asyncio.to_thread(command.upgrade, config, "head")
    assert await runs(old) == (first, first, sick)


# Batches of heartbeats covering what makes, keeps and breaks a run: degraded and healthy by
# name and naming no consumer, flaps within a batch, a consumer first heard degraded.
STEPS: list[list[Beat]] = [
    [(AGENT, None, True), (AGENT, CODEX, True)],
    [(AGENT, CODEX, True), (AGENT, CLAUDE, False)],
    [(AGENT, None, False), (AGENT, CLAUDE, True)],
    [(AGENT, CODEX, True), (AGENT, CODEX, False), (AGENT, CODEX, True)],
    [(AGENT, None, True), (AGENT, CLAUDE, True)],
    [(AGENT, None, True), (AGENT, None, False), (AGENT, None, True)],
    [(AGENT, CODEX, False), (AGENT, None, True)],
    [(AGENT, CODEX, True), (AGENT, None, True), (AGENT, CODEX, True)],
    [(AGENT, None, False), (AGENT, CLAUDE, False)],
    [(AGENT, CLAUDE, True), (AGENT, CLAUDE, True)],
]


async def test_degraded_since_is_written_as_the_previous_function_wrote_it(
    old: AsyncEngine, head: AsyncEngine
) -> None:
    """The same batches through 0014's function and through 0019's: after each, every
    `degraded_since` names the same batch (by its receipt time) or is NULL in both."""
    received: dict[str, list[datetime]] = {"0014": [], "0019": []}
    for n, batch in enumerate(STEPS):
        found = {}
        for name, engine in (("0014", old), ("0019", head)):
            received[name].append(await beat(engine, *batch))
            by_batch = {at: i for i, at in enumerate(received[name])}
            found[name] = {k: by_batch.get(v, v) for k, v in (await degraded_since(engine)).items()}
        assert found["0014"] == found["0019"], f"after batch {n}"
        # And policy, on 0019's facts, decides the same run.
        agent, codex, claude = await runs(head)
        since = await degraded_since(head)
        assert (agent, codex, claude) == (since.get(AGENT), since.get(CODEX), since.get(CLAUDE))
