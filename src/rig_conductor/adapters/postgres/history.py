"""What the console reads from PostgreSQL: the last scans and the reclaim history.

Scan reports are written by the reaper after each scan (kept as many days as the event log);
reclaims are the RECLAIMED rows of the event log, one per batch of moved entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events, scan_reports
from rig_conductor.domain import EventKind


@dataclass(frozen=True, slots=True)
class ScanRow:
    finished_at: datetime
    dry_run: bool
    pending: int
    reclaimed: int
    dead_lettered: int
    report: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ReclaimRow:
    occurred_at: datetime
    stream: str
    group: str
    from_consumer: str
    from_agent: str | None
    to_consumer: str
    to_agent: str | None
    reason: str
    by: str | None  # who moved them, for an operator's move
    entry_ids: tuple[str, ...]
    id: int = 0  # the event-log row's: a page cursor


@dataclass(frozen=True, slots=True)
class ReclaimFilter:
    stream: str | None = None
    agent: str | None = None  # the agent the entries left or went to
    reason: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    before_id: int | None = None  # rows older than this one (the previous page's last `id`)


async def recent_scans(engine: AsyncEngine, *, tenant: str, limit: int) -> list[ScanRow]:
    """The tenant's last `limit` scans, newest first."""
    query = (
        select(
            scan_reports.c.finished_at,
            scan_reports.c.dry_run,
            scan_reports.c.pending,
            scan_reports.c.reclaimed,
            scan_reports.c.dead_lettered,
            scan_reports.c.report,
        )
        .where(scan_reports.c.tenant == tenant)
        .order_by(scan_reports.c.id.desc())
        .limit(limit)
    )
    async with engine.connect() as conn:
        return [ScanRow(*row) for row in await conn.execute(query)]


# Completions accepted per bucket of the window, by the bucket's start (epoch seconds). A
# completion carried over to an entry appended again after Redis lost its data ran no handler.
_FINISHED = text(
    """
    SELECT CAST(floor(extract(epoch FROM occurred_at) / :bucket_s) * :bucket_s AS bigint),
           count(*)
      FROM events
     WHERE tenant = :tenant AND kind = :kind AND NOT fenced
       AND occurred_at > now() - make_interval(secs => :window_s)
       AND NOT (detail ? 'carriedFrom')
     GROUP BY 1
    """
)


async def finished_per_bucket(
    engine: AsyncEngine, *, tenant: str, window_s: int, bucket_s: int
) -> dict[int, int]:
    """Bucket start (epoch seconds) -> completions accepted in it, over the last `window_s`."""
    params = {
        "tenant": tenant,
        "kind": EventKind.WORK_COMPLETED,
        "window_s": window_s,
        "bucket_s": bucket_s,
    }
    async with engine.connect() as conn:
        return {int(t): int(n) for t, n in await conn.execute(_FINISHED, params)}


async def forget_scans(engine: AsyncEngine, *, older_than_days: int) -> int:
    cutoff = func.now() - func.make_interval(0, 0, 0, older_than_days)
    async with engine.begin() as conn:
        result = await conn.execute(delete(scan_reports).where(scan_reports.c.finished_at < cutoff))
    return int(result.rowcount or 0)


async def reclaims(
    engine: AsyncEngine, *, tenant: str, where: ReclaimFilter, limit: int
) -> list[ReclaimRow]:
    """RECLAIMED rows matching `where`, newest first."""
    detail = events.c.detail
    query = select(
        events.c.occurred_at,
        events.c.stream,
        events.c.group_name,
        events.c.consumer,
        events.c.agent_id,
        detail["toConsumer"].astext,
        detail["toAgent"].astext,
        detail["reason"].astext,
        detail["by"].astext,
        events.c.entry_ids,
        events.c.entry_id,
        events.c.id,
    ).where(events.c.tenant == tenant, events.c.kind == EventKind.RECLAIMED)
    if where.stream:
        query = query.where(events.c.stream == where.stream)
    if where.agent:
        query = query.where(
            (events.c.agent_id == where.agent) | (detail["toAgent"].astext == where.agent)
        )
    if where.reason:
        query = query.where(detail["reason"].astext == where.reason)
    if where.since is not None:
        query = query.where(events.c.occurred_at >= where.since)
    if where.until is not None:
        query = query.where(events.c.occurred_at < where.until)
    if where.before_id is not None:
        query = query.where(events.c.id < where.before_id)
    query = query.order_by(events.c.id.desc()).limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [
        ReclaimRow(
            occurred_at=row[0],
            stream=row[1] or "",
            group=row[2] or "",
            from_consumer=row[3] or "",
            from_agent=row[4],
            to_consumer=row[5] or "",
            to_agent=row[6],
            reason=row[7] or "down",  # rows from before reasons were recorded
            by=row[8],
            entry_ids=tuple(row[9] or ((row[10],) if row[10] else ())),
            id=row[11],
        )
        for row in rows
    ]
