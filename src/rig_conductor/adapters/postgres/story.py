"""What the event log and the assignment rows know of one piece of work: its entries, a page of
its timeline (runs of WORK_PROGRESS folded into one row by PostgreSQL), its assignments.

Every read goes through an index: an issue's rows through `ix_events_issue`, an entry's through
`ix_events_stream_entry`, the RECLAIMED rows that name an entry in their batch through
`ix_events_entry_span` (GiST on the span of times a batch covers, migration 0020), then the
batch's `entry_ids`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Table, func, select, text, true
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, events, group_assignments
from rig_conductor.domain import EventKind

# The event-log kinds of a piece of work's story (`policy.story.EVENT_KINDS` names them).
STORY_KINDS = (
    EventKind.ISSUE_ASSIGNED,
    EventKind.WORK_STARTED,
    EventKind.WORK_PROGRESS,
    EventKind.WORK_COMPLETED,
    EventKind.WORK_PUBLISHED,
    EventKind.WORK_FAILED,
    EventKind.RECLAIMED,
    EventKind.DEAD_LETTERED,
    EventKind.DEAD_LETTER_REQUEUED,
    EventKind.DEAD_LETTER_DELETED,
)
# The kinds that bring an entry into an issue's story: its dispatch (again, after Redis lost
# it), a requeue of its dead letter, and the reports of agents that read a foreign entry.
_ENTRY_KINDS = (EventKind.ISSUE_ASSIGNED, EventKind.DEAD_LETTER_REQUEUED, EventKind.WORK_STARTED)
# The most entries one issue's story follows (dispatches again, requeues).
MAX_ENTRIES = 100


@dataclass(frozen=True, slots=True)
class EntryRef:
    stream: str
    entry_id: str


@dataclass(frozen=True, slots=True)
class StoryRow:
    """An event-log row, or a run of `count` WORK_PROGRESS rows of one attempt in a row
    (`occurred_at` the first, `until` the last). `last_id` is the page cursor."""

    last_id: int
    occurred_at: datetime
    until: datetime
    kind: str
    consumer: str | None
    agent_id: str | None
    stream: str | None
    group_name: str | None
    entry_id: str | None
    attempt: int | None
    fenced: bool
    detail: Mapping[str, Any]
    count: int


@dataclass(frozen=True, slots=True)
class AssignmentRow:
    state: str
    consumer: str | None
    attempt: int
    issue_id: str | None


async def issue_entries(engine: AsyncEngine, *, tenant: str, issue_id: str) -> list[EntryRef]:
    """The entries an issue was dispatched (or requeued, or reported on) as, oldest first."""
    query = (
        select(events.c.stream, events.c.entry_id)
        .where(
            events.c.issue_id == issue_id,
            events.c.tenant == tenant,
            events.c.kind.in_(_ENTRY_KINDS),
            events.c.stream.is_not(None),
            events.c.entry_id.is_not(None),
        )
        .group_by(events.c.stream, events.c.entry_id)
        .order_by(text("min(events.id)"))
        .limit(MAX_ENTRIES)
    )
    async with engine.connect() as conn:
        return [EntryRef(stream, entry_id) for stream, entry_id in await conn.execute(query)]


async def dispatched(engine: AsyncEngine, *, tenant: str, issue_id: str) -> bool:
    """Whether the issue was ever dispatched through the API."""
    query = (
        select(events.c.id)
        .where(
            events.c.issue_id == issue_id,
            events.c.tenant == tenant,
            events.c.kind == EventKind.ISSUE_ASSIGNED,
        )
        .limit(1)
    )
    async with engine.connect() as conn:
        return (await conn.execute(query)).first() is not None


# The entry's rows are read through `ix_events_stream_entry` before the first is picked. As
# `ORDER BY id LIMIT 1` on the table, an entry with many rows (10,000 progress reports) makes
# walking the primary key look cheaper to the planner, which then reads every row older than a
# recent entry's first: 40 ms at 225,000 rows, growing with the log (bench/scale.py).
_ENTRY_ISSUE = text(
    """
    WITH entry_rows AS MATERIALIZED (
        SELECT id, issue_id FROM events
         WHERE stream = :stream AND entry_id = :entry_id AND tenant = :tenant
           AND issue_id IS NOT NULL
    )
    SELECT issue_id FROM entry_rows ORDER BY id LIMIT 1
    """
)


async def entry_issue(engine: AsyncEngine, *, tenant: str, entry: EntryRef) -> str | None:
    """The issue an entry's rows name, if any does (its dispatch's first): read in the time of
    the entry's own rows, whatever the log holds."""
    params = {"stream": entry.stream, "entry_id": entry.entry_id, "tenant": tenant}
    async with engine.connect() as conn:
        row = (await conn.execute(_ENTRY_ISSUE, params)).first()
    return None if row is None else str(row[0])


async def assignment_rows(
    engine: AsyncEngine, *, tenant: str, entry: EntryRef
) -> dict[str | None, AssignmentRow]:
    """The entry's attempts in each group that works on it, by group: the first group's row
    (None: a row from before groups were recorded) and every other group's."""
    first = _assignments_of(assignments, tenant=tenant, entry=entry)
    others = _assignments_of(group_assignments, tenant=tenant, entry=entry)
    async with engine.connect() as conn:
        return {
            row.group_name: AssignmentRow(row.state, row.consumer, row.attempt, row.issue_id)
            for row in await conn.execute(first.union_all(others))
        }


def _assignments_of(table: Table, *, tenant: str, entry: EntryRef) -> Select[Any]:
    """The entry's rows of one assignment table (both have the same columns)."""
    return select(
        table.c.group_name, table.c.state, table.c.consumer, table.c.attempt, table.c.issue_id
    ).where(
        table.c.tenant == tenant,
        table.c.stream == entry.stream,
        table.c.entry_id == entry.entry_id,
    )


# The entries' rows after the cursor, RECLAIMED batches that name them included, then runs of
# WORK_PROGRESS of one attempt (one entry, one consumer, none fenced) folded into one row each.
_TIMELINE = text(
    """
    WITH wanted AS (
        SELECT w.*, rig_entry_span(ARRAY[w.entry_id]) AS span
          FROM unnest(CAST(:streams AS text[]), CAST(:ids AS text[])) AS w(stream, entry_id)
    ), matched AS (
        SELECT e.id, e.occurred_at, e.kind, e.consumer, e.agent_id, e.stream, e.group_name,
               e.entry_id, e.attempt, e.fenced, e.detail
          FROM wanted w
          JOIN events e ON e.stream = w.stream AND e.entry_id = w.entry_id
         WHERE e.tenant = :tenant AND e.kind = ANY(CAST(:kinds AS text[])) AND e.id > :after
        UNION ALL
        SELECT e.id, e.occurred_at, e.kind, e.consumer, e.agent_id, e.stream, e.group_name,
               w.entry_id, e.attempt, e.fenced, e.detail
          FROM events e
          JOIN wanted w ON rig_entry_span(e.entry_ids) && w.span
         WHERE e.entry_ids IS NOT NULL AND w.stream = e.stream AND w.entry_id = ANY(e.entry_ids)
           AND e.tenant = :tenant AND e.kind = 'RECLAIMED' AND e.id > :after
    ), marked AS (
        SELECT m.*,
               CASE WHEN m.kind = 'WORK_PROGRESS' AND NOT m.fenced
                     AND lag(m.kind) OVER w = 'WORK_PROGRESS' AND NOT lag(m.fenced) OVER w
                     AND lag(m.stream) OVER w = m.stream AND lag(m.entry_id) OVER w = m.entry_id
                     AND lag(m.consumer) OVER w IS NOT DISTINCT FROM m.consumer
                     AND lag(m.attempt) OVER w IS NOT DISTINCT FROM m.attempt
                    THEN 0 ELSE 1 END AS opens
          FROM matched m
        WINDOW w AS (ORDER BY m.id, m.entry_id)
    ), runs AS (
        SELECT marked.*, sum(opens) OVER (ORDER BY id, entry_id) AS run FROM marked
    )
    SELECT max(id) AS last_id, min(occurred_at) AS occurred_at, max(occurred_at) AS until,
           min(kind) AS kind, min(consumer) AS consumer, min(agent_id) AS agent_id,
           min(stream) AS stream, min(group_name) AS group_name, min(entry_id) AS entry_id,
           min(attempt) AS attempt, bool_or(fenced) AS fenced,
           (array_agg(detail ORDER BY id))[1] AS detail, count(*) AS n
      FROM runs
     GROUP BY run
     ORDER BY run
     LIMIT :limit
    """
)


async def timeline(
    engine: AsyncEngine,
    *,
    tenant: str,
    entries: Sequence[EntryRef],
    after: int,
    limit: int,
) -> list[StoryRow]:
    """Up to `limit` items of the entries' story after event `after`, in the order they were
    recorded (the log's own sequence)."""
    if not entries:
        return []
    params = {
        "tenant": tenant,
        "streams": [e.stream for e in entries],
        "ids": [e.entry_id for e in entries],
        "kinds": list(STORY_KINDS),
        "after": after,
        "limit": limit,
    }
    async with engine.connect() as conn:
        rows = await conn.execute(_TIMELINE, params)
        return [
            StoryRow(
                last_id=row.last_id,
                occurred_at=row.occurred_at,
                until=row.until,
                kind=row.kind,
                consumer=row.consumer,
                agent_id=row.agent_id,
                stream=row.stream,
                group_name=row.group_name,
                entry_id=row.entry_id,
                attempt=row.attempt,
                fenced=bool(row.fenced),
                detail=row.detail or {},
                count=int(row.n),
            )
            for row in rows
        ]


async def dead_lettered_groups(
    engine: AsyncEngine, *, tenant: str, entry: EntryRef
) -> frozenset[str]:
    """The groups in which the entry was dead-lettered."""
    query = select(events.c.group_name).where(
        events.c.stream == entry.stream,
        events.c.entry_id == entry.entry_id,
        events.c.tenant == tenant,
        events.c.kind == EventKind.DEAD_LETTERED,
    )
    async with engine.connect() as conn:
        return frozenset(str(g) for (g,) in await conn.execute(query) if g is not None)


async def attempt_seconds(
    engine: AsyncEngine,
    *,
    tenant: str,
    stream: str,
    entry_id: str,
    attempt: int,
    group: str | None = None,
) -> float | None:
    """Seconds since the attempt's accepted WORK_STARTED in `group` (attempts are numbered per
    group; None: any) (None: no such start recorded)."""
    query = (
        select(func.extract("epoch", func.now() - events.c.occurred_at))
        .where(
            events.c.stream == stream,
            events.c.entry_id == entry_id,
            events.c.tenant == tenant,
            events.c.kind == EventKind.WORK_STARTED,
            events.c.attempt == attempt,
            events.c.fenced.is_(False),
            true() if group is None else events.c.group_name == group,
        )
        .order_by(events.c.id.desc())
        .limit(1)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    return None if row is None else max(0.0, float(row[0]))
