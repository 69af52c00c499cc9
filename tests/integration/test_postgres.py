"""Heartbeat storage, the event log and migrations against a real PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import intake, migrations, queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import AgentId, ConsumerName

from .helpers import heartbeats_stored

HB = intake.HeartbeatIn


async def test_heartbeats_keep_the_latest_state_and_every_event(engine: AsyncEngine) -> None:
    first = await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[HB(AgentId("dev-e"), ConsumerName("dev-e-0")), HB(AgentId("qa-e"))],
    )
    second = await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[
            HB(AgentId("dev-e"), ConsumerName("dev-e-1"), True, ("codex_quota_exhausted",))
        ],
    )
    assert second >= first
    _, rows = await queries.list_agents(engine, tenant="default")
    agents = {a.agent_id: a for a in rows}
    assert set(agents) == {"dev-e", "qa-e"}
    assert agents["dev-e"].last_heartbeat_at == second
    assert agents["dev-e"].degraded and agents["dev-e"].degraded_reasons == (
        "codex_quota_exhausted",
    )
    assert agents["dev-e"].consumers == ("dev-e-0", "dev-e-1")
    assert agents["qa-e"].last_heartbeat_at == first and agents["qa-e"].consumers == ()
    assert await heartbeats_stored(engine) == 3
    # No heartbeat went to the event log, and no interval ended: nothing but the two rows.
    assert await queries.count_events(engine, tenant="default", kind="HEARTBEAT") == 0


async def test_tenants_are_separate(engine: AsyncEngine) -> None:
    await intake.record_heartbeats(engine, tenant="acme", heartbeats=[HB(AgentId("dev-e"))])
    assert (await queries.list_agents(engine, tenant="default"))[1] == []
    evidence = await queries.load_evidence(
        engine, tenant="default", configured_agents=["x"], down_ms=60_000
    )
    assert evidence.agent_heartbeats == {} and evidence.known_agents == {"x"}


async def test_evidence_is_judged_at_the_database_clock(engine: AsyncEngine) -> None:
    stamped = await intake.record_heartbeats(
        engine, tenant="default", heartbeats=[HB(AgentId("dev-e"), ConsumerName("dev-e-0"))]
    )
    evidence = await queries.load_evidence(
        engine, tenant="default", configured_agents=["review-e"], down_ms=60_000
    )
    assert evidence.known_agents == {"dev-e", "review-e"}
    assert evidence.agent_heartbeats["dev-e"].at == stamped
    assert evidence.consumer_heartbeats["dev-e-0"].at == stamped
    assert evidence.now >= stamped
    assert evidence.now.tzinfo is not None


async def test_events_appended_with_copy_are_committed(engine: AsyncEngine) -> None:
    rows = [
        queries.EventRow(
            "RECLAIMED",
            "dev-e",
            "dev-e-0",
            "rig:dispatch",
            "g",
            f"{i}-0",
            detail=json.dumps({"toConsumer": "qa-e-0", "note": "tab\there, \\ and \n"}),
        )
        for i in range(3)
    ]
    await pg_writes.append_events(engine, tenant="default", rows=rows)
    async with engine.connect() as conn:
        stored = (await conn.execute(select(events).order_by(events.c.id))).all()
    assert [r.entry_id for r in stored] == ["0-0", "1-0", "2-0"]
    assert stored[0].detail == {"toConsumer": "qa-e-0", "note": "tab\there, \\ and \n"}
    assert stored[0].occurred_at is not None and stored[0].tenant == "default"


async def test_migrate_is_idempotent(database_url: str, engine: AsyncEngine) -> None:
    migrations.upgrade(database_url)
    migrations.upgrade(database_url)
    assert migrations.is_current(database_url)
    async with engine.connect() as conn:
        version = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar_one()
    assert version == migrations.head_revision(database_url)
    assert await pg_engine.schema_problem(engine) is None


def test_the_schema_check_knows_the_newest_migration(database_url: str) -> None:
    """Commands check the schema against `SCHEMA_HEAD` without loading alembic: a migration
    added without moving it would make them refuse a database migrated to head."""
    assert migrations.head_revision(database_url) == pg_engine.SCHEMA_HEAD


async def test_the_schema_check_names_a_database_behind(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    try:
        problem = await pg_engine.schema_problem(engine)
    finally:
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE alembic_version SET version_num = :head"),
                {"head": pg_engine.SCHEMA_HEAD},
            )
    assert problem == (
        f"Database schema is at revision 0001, this release needs {pg_engine.SCHEMA_HEAD}: "
        "run `rig-conductor migrate` (against RIG_DATABASE_URL)"
    )


async def intervals(engine: AsyncEngine) -> list[tuple[str, str | None, bool, int]]:
    """The ended liveness intervals: (agent, consumer, degraded, beats), oldest first."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT agent_id, consumer, degraded, beats FROM liveness ORDER BY id")
        )
        return [(a, c, d, int(n)) for a, c, d, n in rows]


async def test_heartbeats_extend_an_interval_until_a_gap_or_a_change(engine: AsyncEngine) -> None:
    """Durable storage grows with changes: beats extend the open interval; a gap longer than
    the break, or another `degraded`, ends it as one `liveness` row."""
    beat = [HB(AgentId("dev-e"), ConsumerName("dev-e-0"))]
    for _ in range(5):
        await intake.record_heartbeats(engine, tenant="default", heartbeats=beat)
    assert await intervals(engine) == []
    async with engine.connect() as conn:
        open_beats = (
            (
                await conn.execute(
                    text(
                        "SELECT beats FROM agent_heartbeats UNION ALL "
                        "SELECT beats FROM consumer_heartbeats"
                    )
                )
            )
            .scalars()
            .all()
        )
    assert open_beats == [5, 5]

    # `degraded` changes: the healthy interval of the agent and of the consumer ends.
    degraded = [HB(AgentId("dev-e"), ConsumerName("dev-e-0"), True, ("quota",))]
    await intake.record_heartbeats(engine, tenant="default", heartbeats=degraded)
    assert sorted(await intervals(engine), key=str) == sorted(
        [("dev-e", None, False, 5), ("dev-e", "dev-e-0", False, 5)], key=str
    )

    # A gap longer than the break ends the degraded one.
    async with engine.begin() as conn:
        for table in ("agent_heartbeats", "consumer_heartbeats"):
            await conn.execute(
                text(f"UPDATE {table} SET last_heartbeat_at = now() - interval '2 minutes'")
            )
    await intake.record_heartbeats(engine, tenant="default", heartbeats=degraded, break_ms=60_000)
    ended = await intervals(engine)
    assert sorted(ended[2:], key=str) == sorted(
        [("dev-e", None, True, 1), ("dev-e", "dev-e-0", True, 1)], key=str
    )
    assert await heartbeats_stored(engine) == 7

    # Forgetting the agent keeps what it was heard: its open interval ends too.
    await pg_writes.forget_silent(
        engine,
        tenant="default",
        before=datetime.now(UTC) + timedelta(hours=1),
        keep_agents=(),
        keep_consumers=(),
    )
    assert len(await intervals(engine)) == 6
    assert await heartbeats_stored(engine) == 7
