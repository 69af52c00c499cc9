"""Reads and writes of heartbeats and the event log. Returns domain objects; decides nothing."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Text, bindparam, case, func, select, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres import listening, move_targets
from rig_conductor.adapters.postgres.tables import agent_heartbeats, consumer_heartbeats, events
from rig_conductor.domain import (
    AgentId,
    ConsumerName,
    EventKind,
    Evidence,
    Heartbeat,
    Pods,
    PodState,
)


class EventRow(NamedTuple):
    """One row for the append-only event log."""

    kind: EventKind
    agent_id: str | None = None
    consumer: str | None = None
    stream: str | None = None
    group_name: str | None = None
    entry_id: str | None = None
    issue_id: str | None = None
    attempt: int | None = None
    detail: str = "{}"  # JSON text
    fenced: bool = False
    # The entries of an event about many, as a PostgreSQL array literal: stream ids need no
    # quoting, so COPY gets one joined string instead of a thousand values to adapt. Measured
    # (2026-11-27, 200 rows of 1,000 ids, psycopg 3): 0.26-0.35 ms a row joined, 1.2-2.2 ms
    # with psycopg adapting the list, on the reclaim's path.
    entry_ids: str | None = None


@dataclass(frozen=True, slots=True)
class AgentRow:
    agent_id: AgentId
    last_heartbeat_at: datetime
    degraded: bool
    degraded_reasons: tuple[str, ...]
    consumers: tuple[ConsumerName, ...] = field(default=())


async def load_evidence(
    engine: AsyncEngine,
    *,
    tenant: str,
    configured_agents: Iterable[str],
    down_ms: int,
    pods: Pods | None = None,
    read_at: datetime | None = None,
    consumers: Collection[str] | None = None,
) -> Evidence:
    """Heartbeats of the tenant, with PostgreSQL's `now()` as the instant they are judged at,
    the stretches in which conductors were listening, and the moves of the last `down_ms`.

    `pods`: what Kubernetes said (None: nothing, every pod unknown).
    `read_at`: when the reading of Redis that the evidence goes with began (`clock`).
    `consumers`: only these consumers' own heartbeats (a view of one group), not every one.
    """
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        a = agent_heartbeats.c
        agent_rows = await conn.execute(
            select(
                a.agent_id,
                a.last_heartbeat_at,
                a.degraded,
                a.anonymous_at,
                a.anonymous_degraded,
                a.anonymous_since,
            ).where(a.tenant == tenant)
        )
        agents = {AgentId(row[0]): _agent_heartbeat(*row[1:]) for row in agent_rows}
        consumer_beats = await _own_heartbeats(conn, tenant, consumers)
        heard = await listening.heard(conn, tenant=tenant)
        moved_to = await move_targets.since(
            conn, tenant=tenant, after=now - timedelta(milliseconds=down_ms)
        )
    return Evidence(
        now=now,
        # The configured ids (settings drop blanks) and every id a heartbeat named.
        known_agents=frozenset(map(AgentId, configured_agents)) | agents.keys(),
        agent_heartbeats=agents,
        consumer_heartbeats=consumer_beats,
        pods=pods.states if pods is not None else {},
        pods_default=pods.default if pods is not None else PodState.UNKNOWN,
        heard=heard,
        moved_to=moved_to,
        read_at=read_at,
    )


def _agent_heartbeat(
    at: datetime,
    degraded: bool,
    anonymous_at: datetime | None,
    anonymous_degraded: bool | None,
    anonymous_since: datetime | None,
) -> Heartbeat:
    """An agent's row: its latest heartbeat, and the latest of those naming no consumer."""
    if anonymous_degraded is None:
        return Heartbeat(at, degraded)
    anonymous = Heartbeat(anonymous_at or at, anonymous_degraded, anonymous_since)
    return Heartbeat(at, degraded, anonymous=anonymous)


async def own_heartbeats(
    engine: AsyncEngine, *, tenant: str, consumers: Collection[str]
) -> dict[ConsumerName, Heartbeat]:
    """The own heartbeats of `consumers` (those that have one)."""
    async with engine.connect() as conn:
        return await _own_heartbeats(conn, tenant, consumers)


async def _own_heartbeats(
    conn: AsyncConnection, tenant: str, consumers: Collection[str] | None
) -> dict[ConsumerName, Heartbeat]:
    query = select(
        consumer_heartbeats.c.consumer,
        consumer_heartbeats.c.last_heartbeat_at,
        consumer_heartbeats.c.degraded,
        # Read for a degraded run only, the one rule 3b measures (docs/rules.md): a scan
        # reads every holder's heartbeat, and 10,000 timestamps parsed cost it some 4 ms,
        # for nothing when healthy.
        case((consumer_heartbeats.c.degraded, consumer_heartbeats.c.status_since)),
    ).where(consumer_heartbeats.c.tenant == tenant)
    if consumers is not None:
        # The names as rows joined on the primary key: a lookup each, whatever the table's
        # statistics say. (`consumer = ANY(:names)` read every row of the tenant, 160 ms at a
        # million, when the table had not been analyzed since it grew.)
        names = (
            func.unnest(bindparam("names", list(consumers), type_=ARRAY(Text)))
            .table_valued("name")
            .render_derived()
        )
        query = query.join_from(
            names, consumer_heartbeats, consumer_heartbeats.c.consumer == names.c.name
        )
    rows = await conn.execute(query)
    return {ConsumerName(c): Heartbeat(*beat) for c, *beat in rows}


async def clock(engine: AsyncEngine) -> datetime:
    """PostgreSQL's `now()`: the clock heartbeats, moves and listening marks are stamped by."""
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
    return now


async def agent_ids(engine: AsyncEngine, *, tenant: str) -> list[str]:
    """Every agent id in the registry (heard from, not yet forgotten)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(agent_heartbeats.c.agent_id).where(agent_heartbeats.c.tenant == tenant)
        )
        return [agent_id for (agent_id,) in rows]


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


async def count_events(engine: AsyncEngine, *, tenant: str, kind: EventKind) -> int:
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


async def delete_old_intervals(engine: AsyncEngine, *, older_than_days: int) -> int:
    """Delete the liveness intervals that ended before the retention (like the event log)."""
    statement = text("DELETE FROM liveness WHERE heard_to < now() - make_interval(days => :days)")
    async with engine.begin() as conn:
        return (await conn.execute(statement, {"days": older_than_days})).rowcount


@dataclass(frozen=True, slots=True)
class AgentState:
    """One agent of a page: its latest heartbeat, or None for an agent configured and never
    heard from (or forgotten)."""

    agent_id: AgentId
    heartbeat: Heartbeat | None
    degraded_reasons: tuple[str, ...]


# A page of agent ids in keyset order: those with a row (the primary key's order, read no
# further than the page) merged with the configured ones, all compared by PostgreSQL, so the
# order and the `after` cursor agree whatever the collation.
_AGENTS_PAGE_SQL = """
WITH page AS (
    SELECT agent_id FROM (
        (SELECT agent_id FROM agent_heartbeats WHERE tenant = :tenant AND agent_id > :after
          ORDER BY agent_id LIMIT :limit)
        UNION
        SELECT agent_id FROM unnest(CAST(:configured AS text[])) AS c(agent_id)
         WHERE agent_id > :after
    ) ids ORDER BY agent_id LIMIT :limit
)
SELECT p.agent_id, a.last_heartbeat_at, a.degraded, a.degraded_reasons
  FROM page p LEFT JOIN agent_heartbeats a ON a.tenant = :tenant AND a.agent_id = p.agent_id
 ORDER BY p.agent_id
"""

# The freshest consumers of each agent of a page, from the index on
# (tenant, agent_id, last_heartbeat_at DESC, consumer): `:freshest` rows per agent read.
_FRESHEST_SQL = """
SELECT a.agent_id, c.consumer FROM unnest(CAST(:agents AS text[])) AS a(agent_id)
 CROSS JOIN LATERAL (
     SELECT consumer FROM consumer_heartbeats
      WHERE tenant = :tenant AND agent_id = a.agent_id
      ORDER BY last_heartbeat_at DESC, consumer LIMIT :freshest) c
"""

# The ids as one array: `agent_id.in_(ids)` renders a parameter per id, and compiling and
# splitting the 1,000 of a full page cost more than counting.
_CONSUMER_COUNTS_SQL = """
SELECT agent_id, count(*) FROM consumer_heartbeats
 WHERE tenant = :tenant AND agent_id = ANY(CAST(:agents AS text[]))
 GROUP BY agent_id
"""


async def agents_page(
    engine: AsyncEngine,
    *,
    tenant: str,
    configured: Iterable[str],
    after: str | None,
    limit: int,
) -> tuple[datetime, list[AgentState]]:
    """Up to `limit` agents after `after` (exclusive) in agent id order, heard from or
    configured, and PostgreSQL's `now()`."""
    params = {
        "tenant": tenant,
        "after": after or "",
        "limit": limit,
        "configured": sorted({a.strip() for a in configured if a.strip()}),
    }
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        rows = (await conn.execute(text(_AGENTS_PAGE_SQL), params)).all()
    return now, [
        AgentState(
            AgentId(agent_id),
            Heartbeat(at, degraded) if at is not None else None,
            tuple(reasons or ()),
        )
        for agent_id, at, degraded, reasons in rows
    ]


async def freshest_consumers(
    engine: AsyncEngine, *, tenant: str, agents: Sequence[str], freshest: int
) -> dict[AgentId, tuple[list[ConsumerName], int]]:
    """For each agent, its `freshest` most recently heard consumers (freshest first) and how
    many consumers it has in all."""
    params = {"tenant": tenant, "agents": list(agents), "freshest": freshest}
    async with engine.connect() as conn:
        listed = (await conn.execute(text(_FRESHEST_SQL), params)).all()
        counted = await conn.execute(text(_CONSUMER_COUNTS_SQL), params)
        counts: dict[str, int] = {a: n for a, n in counted.all()}
    found: dict[AgentId, tuple[list[ConsumerName], int]] = {
        AgentId(a): ([], int(counts.get(a, 0))) for a in agents
    }
    for agent_id, consumer in listed:
        found[AgentId(agent_id)][0].append(ConsumerName(consumer))
    return found


async def consumers_page(
    engine: AsyncEngine, *, tenant: str, agent: str, after: str | None, limit: int
) -> list[ConsumerName]:
    """Up to `limit` consumers of `agent` after `after` (exclusive), by name."""
    c = consumer_heartbeats.c
    query = (
        select(c.consumer)
        .where(c.tenant == tenant, c.agent_id == agent, c.consumer > (after or ""))
        .order_by(c.consumer)
        .limit(limit)
    )
    async with engine.connect() as conn:
        return [ConsumerName(name) for name in (await conn.execute(query)).scalars()]


async def agent_state(
    engine: AsyncEngine, *, tenant: str, agent: str
) -> tuple[datetime, AgentState | None]:
    """One agent's latest heartbeat (None when it has no row), and PostgreSQL's `now()`."""
    a = agent_heartbeats.c
    query = select(a.last_heartbeat_at, a.degraded, a.degraded_reasons).where(
        a.tenant == tenant, a.agent_id == agent
    )
    async with engine.connect() as conn:
        now: datetime = (await conn.execute(select(func.now()))).scalar_one()
        row = (await conn.execute(query)).first()
    if row is None:
        return now, None
    at, degraded, reasons = row
    return now, AgentState(AgentId(agent), Heartbeat(at, degraded), tuple(reasons))
