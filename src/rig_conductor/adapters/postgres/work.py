"""Dispatch records and per-entry assignment state: the conditional updates behind
idempotent dispatch and attempt fencing. Decides nothing beyond what each statement guards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, dispatches, events
from rig_conductor.domain import EntryId


async def record_dispatch(
    engine: AsyncEngine,
    *,
    tenant: str,
    key: str,
    issue_id: str,
    agent_id: str,
    stream: str,
    entry_id: str,
) -> bool:
    """Record an appended dispatch once per idempotency key; True when recorded now.

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
            )
            .on_conflict_do_nothing()
            .returning(dispatches.c.idempotency_key)
        )
        if inserted.first() is None:
            return False
        await conn.execute(
            events.insert().values(
                tenant=tenant,
                kind="ISSUE_ASSIGNED",
                agent_id=agent_id,
                stream=stream,
                entry_id=entry_id,
                issue_id=issue_id,
                detail={"idempotencyKey": key},
            )
        )
    return True


@dataclass(frozen=True, slots=True)
class WorkReport:
    """A WORK_STARTED / WORK_COMPLETED / WORK_FAILED event as an agent sent it."""

    kind: Literal["WORK_STARTED", "WORK_COMPLETED", "WORK_FAILED"]
    agent_id: str
    stream: str
    entry_id: str
    consumer: str | None = None
    issue_id: str | None = None
    attempt: int | None = None
    error: str | None = None  # WORK_FAILED's error text


@dataclass(frozen=True, slots=True)
class WorkOutcome:
    accepted: bool  # False: fenced off, the report came from an outdated attempt
    attempt: int  # the entry's current attempt after this report
    state: str


_START = text(
    """
    INSERT INTO assignments AS a (tenant, stream, entry_id, issue_id, state, consumer, attempt)
    VALUES (:tenant, :stream, :entry_id, :issue_id, 'running', :consumer, 1)
    ON CONFLICT (tenant, stream, entry_id) DO UPDATE
       -- A reclaim reserved attempt n for its target (state 'pending'): the target's start takes
       -- it rather than skipping a number; any other start opens the next attempt.
       SET attempt = CASE WHEN a.state = 'pending' AND a.consumer = EXCLUDED.consumer
                          THEN a.attempt ELSE a.attempt + 1 END,
           state = 'running', consumer = EXCLUDED.consumer,
           issue_id = COALESCE(a.issue_id, EXCLUDED.issue_id), updated_at = now()
     WHERE a.state NOT IN ('done', 'dead')
       AND (CAST(:claimed AS integer) IS NULL OR CAST(:claimed AS integer) >= a.attempt)
    RETURNING attempt, state
    """
)

_FINISH = text(
    """
    INSERT INTO assignments AS a (tenant, stream, entry_id, issue_id, state, consumer, attempt)
    VALUES (:tenant, :stream, :entry_id, :issue_id, :state, :consumer,
            COALESCE(CAST(:claimed AS integer), 1))
    ON CONFLICT (tenant, stream, entry_id) DO UPDATE
       SET state = EXCLUDED.state, consumer = EXCLUDED.consumer,
           issue_id = COALESCE(a.issue_id, EXCLUDED.issue_id), updated_at = now()
     WHERE a.state <> 'dead'
       AND (a.state <> 'done' OR EXCLUDED.state = 'done')
       AND (CAST(:claimed AS integer) IS NULL OR CAST(:claimed AS integer) >= a.attempt)
    RETURNING attempt, state
    """
)


async def record_work(engine: AsyncEngine, *, tenant: str, report: WorkReport) -> WorkOutcome:
    """Apply a WORK_* report to the entry's assignment row and append it to the event log.

    WORK_STARTED takes a new attempt. Any report carrying an attempt older than the current one
    is fenced: the row is left as it is and the event is logged with `fenced = true`, as the
    audit's evidence of duplicate work. A finished (done or dead) entry is not started again.
    """
    params = {
        "tenant": tenant,
        "stream": report.stream,
        "entry_id": report.entry_id,
        "issue_id": report.issue_id,
        "consumer": report.consumer,
        "claimed": report.attempt,
    }
    async with engine.begin() as conn:
        if report.kind == "WORK_STARTED":
            row = (await conn.execute(_START, params)).first()
        else:
            state = "done" if report.kind == "WORK_COMPLETED" else "failed"
            row = (await conn.execute(_FINISH, {**params, "state": state})).first()
        if row is None:
            current = (
                await conn.execute(
                    select(assignments.c.attempt, assignments.c.state).where(
                        assignments.c.tenant == tenant,
                        assignments.c.stream == report.stream,
                        assignments.c.entry_id == report.entry_id,
                    )
                )
            ).one()
            outcome = WorkOutcome(False, current.attempt, current.state)
        else:
            outcome = WorkOutcome(True, row.attempt, row.state)
        attempt = (
            outcome.attempt
            if report.kind == "WORK_STARTED" and outcome.accepted
            else report.attempt
        )
        await conn.execute(
            events.insert().values(
                tenant=tenant,
                kind=report.kind,
                agent_id=report.agent_id,
                consumer=report.consumer,
                stream=report.stream,
                entry_id=report.entry_id,
                issue_id=report.issue_id,
                attempt=attempt,
                fenced=not outcome.accepted,
                detail={"error": report.error} if report.error else {},
            )
        )
    return outcome


async def worn_attempts(
    engine: AsyncEngine, *, tenant: str, stream: str, at_least: int
) -> dict[EntryId, int]:
    """Entries of `stream` not yet finished whose recorded attempts reached `at_least`."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(assignments.c.entry_id, assignments.c.attempt).where(
                assignments.c.tenant == tenant,
                assignments.c.stream == stream,
                assignments.c.attempt >= at_least,
                assignments.c.state.notin_(("done", "dead")),
            )
        )
        return {EntryId(entry_id): attempt for entry_id, attempt in rows}


async def reclaimed(
    engine: AsyncEngine, *, tenant: str, stream: str, consumer: str, entry_ids: Sequence[str]
) -> None:
    """A reclaim opens a new attempt reserved for the target: the old owner is fenced off now,
    before the target even starts. Entries nobody reported on have no row and need none."""
    if not entry_ids:
        return
    # Stream ids hold no commas: one joined string is far cheaper to send than a large array.
    statement = text(
        """
        UPDATE assignments SET attempt = attempt + 1, state = 'pending', consumer = :consumer,
               updated_at = now()
         WHERE tenant = :tenant AND stream = :stream
           AND entry_id = ANY(string_to_array(:ids, ','))
           AND state NOT IN ('done', 'dead')
        """
    )
    async with engine.begin() as conn:
        await conn.execute(
            statement,
            {"tenant": tenant, "stream": stream, "consumer": consumer, "ids": ",".join(entry_ids)},
        )


async def dead_lettered(
    engine: AsyncEngine, *, tenant: str, stream: str, entries: Sequence[tuple[str, str | None, int]]
) -> None:
    """Mark (entry id, issue id, deliveries) dead: no later report revives them."""
    if not entries:
        return
    async with engine.begin() as conn:
        statement = insert(assignments).values(
            [
                {
                    "tenant": tenant,
                    "stream": stream,
                    "entry_id": entry_id,
                    "issue_id": issue_id,
                    "state": "dead",
                    "attempt": max(deliveries, 1),
                }
                for entry_id, issue_id, deliveries in entries
            ]
        )
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["tenant", "stream", "entry_id"],
                set_={"state": "dead", "updated_at": func.now()},
            )
        )
