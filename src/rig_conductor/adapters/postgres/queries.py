"""Reads and writes of heartbeats and the event log. Returns domain objects; decides nothing."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import agent_heartbeats, consumer_heartbeats, events
from rig_conductor.domain import AgentId, ConsumerName, Evidence, Heartbeat, PodState
from rig_conductor.policy import agents as agent_policy


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    """One HEARTBEAT as received; its time is the server's receipt time, set on write."""

    agent_id: AgentId
    consumer: ConsumerName | None = None
    degraded: bool = False
    degraded_reasons: tuple[str, ...] = ()


class EventRow(NamedTuple):
    """One row for the append-only event log."""

    kind: str
    agent_id: str | None = None
    consumer: str | None = None
    stream: str | None = None
    group_name: str | None = None
    entry_id: str | None = None
    issue_id: str | None = None
    attempt: int | None = None
    detail: str = "{}"  # JSON text
    fenced: bool = False
    entry_ids: str | None = None  # a PostgreSQL array literal, for events about many entries


@dataclass(frozen=True, slots=True)
class AgentRow:
    agent_id: AgentId
    last_heartbeat_at: datetime
    degraded: bool
    degraded_reasons: tuple[str, ...]
    consumers: tuple[ConsumerName, ...] = field(default=())


async def record_heartbeats(
    engine: AsyncEngine, *, tenant: str, heartbeats: Sequence[HeartbeatIn]
) -> datetime:
    """Store a batch of heartbeats in one transaction; returns the receipt time it stamped.

    The latest state per agent and per consumer is upserted (rows locked in key order, so
    concurrent batches cannot deadlock) and every heartbeat is appended to the event log.
    """
    async with engine.begin() as conn:
        received_at: datetime = (await conn.execute(select(func.now()))).scalar_one()
        await conn.execute(
            events.insert(),
            [
                {
                    "tenant": tenant,
                    "occurred_at": received_at,
                    "kind": "HEARTBEAT",
                    "agent_id": hb.agent_id,
                    "consumer": hb.consumer,
                    "detail": {
                        "degraded": hb.degraded,
                        "degradedReasons": list(hb.degraded_reasons),
                    },
                }
                for hb in heartbeats
            ],
        )
        latest_agent = {hb.agent_id: hb for hb in heartbeats}
        await _upsert(
            conn,
            agent_heartbeats,
            ("tenant", "agent_id"),
            [
                _state(tenant, received_at, hb, agent_id=key)
                for key, hb in sorted(latest_agent.items())
            ],
        )
        latest_consumer = {hb.consumer: hb for hb in heartbeats if hb.consumer}
        await _upsert(
            conn,
            consumer_heartbeats,
            ("tenant", "consumer"),
            [
                _state(tenant, received_at, hb, consumer=key, agent_id=hb.agent_id)
                for key, hb in sorted(latest_consumer.items())
            ],
        )
    return received_at


def _state(tenant: str, at: datetime, hb: HeartbeatIn, **key: str) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "last_heartbeat_at": at,
        "degraded": hb.degraded,
        "degraded_reasons": list(hb.degraded_reasons),
        **key,
    }


async def _upsert(conn: Any, table: Any, keys: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    stmt = insert(table).values(rows)
    changed = {c: stmt.excluded[c] for c in rows[0] if c not in keys}
    await conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=changed))


async def load_evidence(
    engine: AsyncEngine,
    *,
    tenant: str,
    configured_agents: Iterable[str],
    pods: Mapping[ConsumerName, PodState] | None = None,
) -> Evidence:
    """Heartbeats of the tenant, with PostgreSQL's `now()` as the instant they are judged at."""
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        agent_rows = await conn.execute(
            select(
                agent_heartbeats.c.agent_id,
                agent_heartbeats.c.last_heartbeat_at,
                agent_heartbeats.c.degraded,
            ).where(agent_heartbeats.c.tenant == tenant)
        )
        agents = {AgentId(a): Heartbeat(at, degraded) for a, at, degraded in agent_rows}
        consumer_rows = await conn.execute(
            select(
                consumer_heartbeats.c.consumer,
                consumer_heartbeats.c.last_heartbeat_at,
                consumer_heartbeats.c.degraded,
            ).where(consumer_heartbeats.c.tenant == tenant)
        )
        consumers = {ConsumerName(c): Heartbeat(at, degraded) for c, at, degraded in consumer_rows}
    return Evidence(
        now=now,
        known_agents=agent_policy.known_agents(configured_agents, agents),
        agent_heartbeats=agents,
        consumer_heartbeats=consumers,
        pods=pods or {},
    )


async def list_agents(engine: AsyncEngine, *, tenant: str) -> tuple[datetime, list[AgentRow]]:
    """Latest state of every agent with the consumers that heartbeated for it, and `now()`."""
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        rows = (
            await conn.execute(
                select(agent_heartbeats)
                .where(agent_heartbeats.c.tenant == tenant)
                .order_by(agent_heartbeats.c.agent_id)
            )
        ).all()
        consumer_rows = (
            await conn.execute(
                select(consumer_heartbeats.c.agent_id, consumer_heartbeats.c.consumer)
                .where(consumer_heartbeats.c.tenant == tenant)
                .order_by(consumer_heartbeats.c.consumer)
            )
        ).all()
    by_agent: dict[str, list[ConsumerName]] = {}
    for agent_id, consumer in consumer_rows:
        by_agent.setdefault(agent_id, []).append(ConsumerName(consumer))
    return now, [
        AgentRow(
            AgentId(row.agent_id),
            row.last_heartbeat_at,
            row.degraded,
            tuple(row.degraded_reasons),
            tuple(by_agent.get(row.agent_id, ())),
        )
        for row in rows
    ]


# COPY column order: the tenant, then EventRow's fields in their declared order.
_EVENT_COLUMNS = ("tenant", *EventRow._fields)


async def append_events(engine: AsyncEngine, *, tenant: str, rows: Sequence[EventRow]) -> None:
    """Append rows to the event log with COPY: a scan can record a million reclaims."""
    if not rows:
        return
    # begin() commits the DBAPI connection on exit, which the raw COPY below writes through.
    async with engine.begin() as conn:
        raw = await conn.get_raw_connection()
        pg = raw.driver_connection
        assert pg is not None
        async with pg.cursor() as cursor:
            statement = f"COPY events ({', '.join(_EVENT_COLUMNS)}) FROM STDIN"
            async with cursor.copy(statement) as copy:
                for row in rows:
                    await copy.write_row((tenant, *row))


async def count_events(engine: AsyncEngine, *, tenant: str, kind: str) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).where(events.c.tenant == tenant, events.c.kind == kind)
        return int((await conn.execute(query)).scalar_one())


RETENTION_BATCH = 10_000


async def delete_old_events(
    engine: AsyncEngine, *, older_than_days: int, batch: int = RETENTION_BATCH
) -> int:
    """Delete events older than the retention, `batch` rows per short transaction.

    Small batches keep each lock brief, so heartbeats and scans never wait behind a purge.
    """
    statement = text(
        "DELETE FROM events WHERE id IN (SELECT id FROM events "
        "WHERE occurred_at < now() - make_interval(days => :days) ORDER BY id LIMIT :batch)"
    )
    deleted = 0
    while True:
        async with engine.begin() as conn:
            result = await conn.execute(statement, {"days": older_than_days, "batch": batch})
        deleted += result.rowcount
        if result.rowcount < batch:
            return deleted
