"""Dispatches a Redis failover may have lost: recent ones no agent has reported on, and the
record of appending one again. Decides nothing: `reaper.redispatch` does."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import dispatches, events


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


async def reappended(
    engine: AsyncEngine, *, tenant: str, dispatch: RecentDispatch, entry_id: str
) -> None:
    """The dispatch now lives at `entry_id`: the row follows, and the event log says why (the
    audit counts the old entry as replaced, not lost)."""
    async with engine.begin() as conn:
        await conn.execute(
            dispatches.update()
            .where(
                dispatches.c.tenant == tenant,
                dispatches.c.idempotency_key == dispatch.key,
                dispatches.c.entry_id == dispatch.entry_id,
            )
            .values(entry_id=entry_id)
        )
        await conn.execute(
            events.insert().values(
                tenant=tenant,
                kind="ISSUE_ASSIGNED",
                agent_id=dispatch.agent_id,
                stream=dispatch.stream,
                entry_id=entry_id,
                issue_id=dispatch.issue_id,
                detail={"idempotencyKey": dispatch.key, "replaces": dispatch.entry_id},
            )
        )
