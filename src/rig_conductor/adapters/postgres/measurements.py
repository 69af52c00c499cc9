"""What the last scan measured (`policy.measure`), stored for the views: one row per group and
one per tenant for the agents (migration 0015). Every read is bounded: a page of streams, the
groups needing attention first, or sums."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.domain import ConsumerMeasure, FleetMeasure, GroupMeasure


@dataclass(frozen=True, slots=True)
class Measured:
    group: GroupMeasure
    measured_at: datetime


@dataclass(frozen=True, slots=True)
class Totals:
    groups: int
    pending: int
    consumers: int
    consumers_down: int
    oldest_measured_at: datetime | None  # the age of the stalest figure summed here


# The streams of a page: `limit` of them after `after`, by name.
_PAGE = """WITH page AS (
    SELECT DISTINCT stream FROM group_measurements
     WHERE tenant = :tenant AND (CAST(:after AS text) IS NULL OR stream > :after)
     ORDER BY stream LIMIT :limit
)"""
_COLUMNS = (
    "stream, group_name, pending, consumers, consumers_down, held_by_down, oldest_idle_ms, "
    "dead_letters, top, measured_at"
)


async def streams_page(
    engine: AsyncEngine, *, tenant: str, after: str | None, limit: int
) -> list[Measured]:
    """The groups of the first `limit` streams after `after` (by name), in stream and group
    order: a page never cuts a stream's groups in two."""
    query = text(f"""
        {_PAGE}
        SELECT {_COLUMNS} FROM group_measurements JOIN page USING (stream)
         WHERE tenant = :tenant ORDER BY stream, group_name
    """)
    async with engine.connect() as conn:
        rows = await conn.execute(query, {"tenant": tenant, "after": after, "limit": limit})
        return [_decode(row) for row in rows]


@dataclass(frozen=True, slots=True)
class StreamsPage:
    body: str  # the JSON array of `GET /api/streams`
    streams: int  # how many streams it holds
    last: str | None  # the last of them: the next page starts after it


# GET /api/streams, built by PostgreSQL as the wire's JSON (the `GroupView` schema; `top` is
# stored in the wire shape of its consumers). A page of 100 streams is 1,000 groups and 10,000
# consumers, 1.2 MB: built here, 16 ms (server time, median, bench/scale.py); decoding `top`,
# modelling the page and encoding it again in Python took 121-132 ms.
_STREAMS_PAGE_JSON = text(f"""
    {_PAGE}
    SELECT COALESCE(json_agg(json_build_object(
               'stream', m.stream, 'group', m.group_name, 'pending', m.pending,
               'oldestPendingIdleMs', m.oldest_idle_ms, 'consumers', m.top,
               'consumerCount', m.consumers, 'consumersDown', m.consumers_down,
               'deadLetters', m.dead_letters,
               'asOf', to_char(m.measured_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
           ) ORDER BY m.stream, m.group_name), '[]')::text,
           count(DISTINCT m.stream), max(m.stream)
      FROM group_measurements AS m JOIN page USING (stream)
     WHERE m.tenant = :tenant
""")


async def streams_page_json(
    engine: AsyncEngine, *, tenant: str, after: str | None, limit: int
) -> StreamsPage:
    """`streams_page` as `GET /api/streams` sends it, encoded by PostgreSQL."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                _STREAMS_PAGE_JSON, {"tenant": tenant, "after": after, "limit": limit}
            )
        ).one()
    return StreamsPage(body=row[0], streams=int(row[1]), last=row[2])


async def needing_attention(engine: AsyncEngine, *, tenant: str, limit: int) -> list[Measured]:
    """The `limit` groups with the most down consumers, then the most pending entries."""
    query = text(f"""
        SELECT {_COLUMNS} FROM group_measurements WHERE tenant = :tenant
         ORDER BY consumers_down DESC, pending DESC, stream, group_name LIMIT :limit
    """)
    async with engine.connect() as conn:
        return [
            _decode(row) for row in await conn.execute(query, {"tenant": tenant, "limit": limit})
        ]


async def totals(engine: AsyncEngine, *, tenant: str) -> Totals:
    query = text("""
        SELECT count(*), COALESCE(sum(pending), 0), COALESCE(sum(consumers), 0),
               COALESCE(sum(consumers_down), 0), min(measured_at)
          FROM group_measurements WHERE tenant = :tenant
    """)
    async with engine.connect() as conn:
        row = (await conn.execute(query, {"tenant": tenant})).one()
    return Totals(int(row[0]), int(row[1]), int(row[2]), int(row[3]), row[4])


async def fleet(engine: AsyncEngine, *, tenant: str) -> tuple[FleetMeasure, datetime] | None:
    """The agents' states as the last scan judged them, and when; None before any scan."""
    query = text(
        "SELECT agents_up, agents_down, agents_degraded, measured_at FROM fleet_measurements "
        "WHERE tenant = :tenant"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query, {"tenant": tenant})).first()
    if row is None:
        return None
    return FleetMeasure(int(row[0]), int(row[1]), int(row[2])), row[3]


async def latest(engine: AsyncEngine, *, tenant: str) -> tuple[datetime, datetime | None]:
    """PostgreSQL's now, and when the tenant was last measured (None: never)."""
    query = text(
        "SELECT now(), (SELECT measured_at FROM fleet_measurements WHERE tenant = :tenant)"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query, {"tenant": tenant})).one()
    return row[0], row[1]


def _decode(row: Any) -> Measured:
    top = tuple(
        ConsumerMeasure(c["name"], int(c["pending"]), int(c["idleMs"]), c.get("agentId"))
        for c in row.top
    )
    group = GroupMeasure(
        stream=row.stream,
        group=row.group_name,
        pending=int(row.pending),
        consumers=int(row.consumers),
        consumers_down=int(row.consumers_down),
        held_by_down=int(row.held_by_down),
        oldest_idle_ms=None if row.oldest_idle_ms is None else int(row.oldest_idle_ms),
        top=top,
        dead_letters=int(row.dead_letters),
    )
    return Measured(group, row.measured_at)
