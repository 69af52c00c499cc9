"""Dispatches Redis may have lost: the record of each dispatch, recent ones no agent has reported
on, and the epochs that tell a loss of all of Redis's data (`recovery` has what follows such a
loss). Decides nothing: `reaper.redispatch` and `reaper.redis_loss` do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.tables import dispatches, events, redis_epochs
from rig_conductor.domain import EventKind


@dataclass(frozen=True, slots=True)
class RecentDispatch:
    key: str
    stream: str
    entry_id: str
    issue_id: str
    agent_id: str
    fields: dict[str, str]


# Dispatches recorded within the window, with their fields, that no agent has reported on yet
# (no assignment row): those are the ones a lost append could have dropped unseen.
_RECENT_UNSTARTED = text(
    """
    SELECT d.idempotency_key, d.stream, d.entry_id, d.issue_id, d.agent_id, d.fields
      FROM dispatches d
      LEFT JOIN assignments a
        ON a.tenant = d.tenant AND a.stream = d.stream AND a.entry_id = d.entry_id
     WHERE d.tenant = :tenant AND jsonb_typeof(d.fields) = 'object'
       AND d.created_at > now() - make_interval(secs => :window_s)
       AND a.entry_id IS NULL
     ORDER BY d.created_at
     LIMIT :limit
    """
)


async def record_dispatch(
    engine: AsyncEngine,
    *,
    tenant: str,
    key: str,
    issue_id: str,
    agent_id: str,
    stream: str,
    entry_id: str,
    fields: Mapping[str, str] | None = None,
) -> bool:
    """Record an appended dispatch once per idempotency key, with the `fields` appended; True
    when recorded now.

    Called after every append and every repeat: a repeat whose first attempt appended but could
    not record (PostgreSQL down, or the process killed in between) completes the record, and
    the ISSUE_ASSIGNED event is written exactly once, with the row.
    """
    async with engine.begin() as conn:
        inserted = await conn.execute(
            insert(dispatches)
            .values(
                tenant=tenant,
                idempotency_key=key,
                stream=stream,
                entry_id=entry_id,
                issue_id=issue_id,
                agent_id=agent_id,
                fields=dict(fields) if fields is not None else None,
            )
            .on_conflict_do_nothing()
            .returning(dispatches.c.idempotency_key)
        )
        if inserted.first() is None:
            return False
        await assigned(conn, tenant, agent_id, stream, entry_id, issue_id, {"idempotencyKey": key})
    return True


async def recent_unstarted(
    engine: AsyncEngine, *, tenant: str, window_s: float, limit: int
) -> list[RecentDispatch]:
    params = {"tenant": tenant, "window_s": window_s, "limit": limit}
    async with engine.connect() as conn:
        rows = await conn.execute(_RECENT_UNSTARTED, params)
        return [
            RecentDispatch(key, stream, entry_id, issue_id, agent_id, dict(fields))
            for key, stream, entry_id, issue_id, agent_id, fields in rows
        ]


async def assigned(
    conn: AsyncConnection,
    tenant: str,
    agent_id: str,
    stream: str,
    entry_id: str,
    issue_id: str,
    detail: dict[str, str],
) -> None:
    """The ISSUE_ASSIGNED event of a dispatch row just written, in the row's transaction."""
    await conn.execute(
        events.insert().values(
            tenant=tenant,
            kind=EventKind.ISSUE_ASSIGNED,
            agent_id=agent_id,
            stream=stream,
            entry_id=entry_id,
            issue_id=issue_id,
            detail=detail,
        )
    )


async def remembered_epochs(engine: AsyncEngine, *, tenant: str) -> dict[str, str]:
    """stream -> the Redis epoch marker last recorded beside it."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(redis_epochs.c.stream, redis_epochs.c.epoch).where(
                redis_epochs.c.tenant == tenant
            )
        )
        return {stream: epoch for stream, epoch in rows}
