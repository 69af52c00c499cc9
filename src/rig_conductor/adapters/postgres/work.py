"""Dispatch records and per-entry assignment state: the conditional updates behind
idempotent dispatch and attempt fencing. Decides nothing beyond what each statement guards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, events
from rig_conductor.domain import EntryId, Progress, StreamKey


@dataclass(frozen=True, slots=True)
class WorkReport:
    """A WORK_STARTED / WORK_PROGRESS / WORK_COMPLETED / WORK_FAILED event as an agent sent it."""

    kind: Literal["WORK_STARTED", "WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED"]
    agent_id: str
    stream: str
    entry_id: str
    consumer: str | None = None
    issue_id: str | None = None
    attempt: int | None = None
    error: str | None = None  # WORK_FAILED's error text


@dataclass(frozen=True, slots=True)
class WorkOutcome:
    accepted: bool  # False: fenced off (an outdated attempt), or refused (`refusal`)
    attempt: int  # the entry's current attempt after this report (0: none was ever started)
    state: str
    # Why the report was refused without being recorded: it did not come from the consumer
    # that owns the attempt it names. None for accepted and for fenced reports.
    refusal: str | None = None


_START = text(
    """
    INSERT INTO assignments AS a (tenant, stream, entry_id, issue_id, state, consumer, attempt,
                                  progress_at)
    VALUES (:tenant, :stream, :entry_id, :issue_id, 'running', :consumer, 1, now())
    ON CONFLICT (tenant, stream, entry_id) DO UPDATE
       -- A reclaim reserved attempt n for its target (state 'pending'): the target's start takes
       -- it rather than skipping a number; any other start opens the next attempt.
       SET attempt = CASE WHEN a.state = 'pending' AND a.consumer = EXCLUDED.consumer
                          THEN a.attempt ELSE a.attempt + 1 END,
           state = 'running', consumer = EXCLUDED.consumer,
           issue_id = COALESCE(a.issue_id, EXCLUDED.issue_id), updated_at = now(),
           progress_at = now()
     WHERE a.state NOT IN ('done', 'dead', 'superseded')
       AND (CAST(:claimed AS integer) IS NULL OR CAST(:claimed AS integer) >= a.attempt)
    RETURNING attempt, state
    """
)

# Finishing and progress apply only to the attempt named, and only from the consumer that
# owns it: the one whose start (or the reclaim to it) made that attempt.
_FINISH = text(
    """
    UPDATE assignments AS a
       SET state = :state, issue_id = COALESCE(a.issue_id, :issue_id), updated_at = now()
     WHERE a.tenant = :tenant AND a.stream = :stream AND a.entry_id = :entry_id
       AND a.attempt = :claimed AND a.consumer = :consumer
       AND a.state NOT IN ('dead', 'superseded') AND (a.state <> 'done' OR :state = 'done')
    RETURNING attempt, state
    """
)

# Progress restarts the current attempt's deadline (rule 4b); it changes nothing else.
_PROGRESS = text(
    """
    UPDATE assignments AS a SET progress_at = now(), updated_at = now()
     WHERE a.tenant = :tenant AND a.stream = :stream AND a.entry_id = :entry_id
       AND a.attempt = :claimed AND a.consumer = :consumer
       AND a.state NOT IN ('done', 'dead', 'superseded')
    RETURNING attempt, state
    """
)


async def record_work(engine: AsyncEngine, *, tenant: str, report: WorkReport) -> WorkOutcome:
    """Apply a WORK_* report to the entry's assignment row and append it to the event log.

    WORK_STARTED takes a new attempt (the caller has checked that the consumer holds the
    entry). Any report carrying an attempt older than the current one is fenced: the row is left
    as it is and the event is logged with `fenced = true`, as the audit's evidence of duplicate
    work. A finished (done or dead) entry is not started again, nor is a superseded one (Redis
    lost it and its dispatch lives on as a new entry): every later report on it is fenced. A
    progress or finishing report from a consumer that does not own the attempt it names is
    refused: nothing is written.
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
        elif report.kind == "WORK_PROGRESS":
            row = (await conn.execute(_PROGRESS, params)).first()
        else:
            state = "done" if report.kind == "WORK_COMPLETED" else "failed"
            row = (await conn.execute(_FINISH, {**params, "state": state})).first()
        if row is None:
            outcome = await _not_applied(conn, tenant, report)
            if outcome.refusal is not None:
                return outcome
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


async def _not_applied(conn: AsyncConnection, tenant: str, report: WorkReport) -> WorkOutcome:
    """Why a report changed nothing: fenced (an older attempt, or a finished entry), or refused
    (not from the attempt's owner)."""
    current = (
        await conn.execute(
            select(assignments.c.attempt, assignments.c.state, assignments.c.consumer).where(
                assignments.c.tenant == tenant,
                assignments.c.stream == report.stream,
                assignments.c.entry_id == report.entry_id,
            )
        )
    ).first()
    if current is None:
        return WorkOutcome(False, 0, "none", "no attempt of this entry was started")
    claimed = report.attempt
    if report.kind == "WORK_STARTED" or claimed is None or claimed < current.attempt:
        return WorkOutcome(False, current.attempt, current.state)  # fenced
    if claimed > current.attempt:
        refusal = f"attempt {claimed} was never made (the current one is {current.attempt})"
    elif current.consumer != report.consumer:
        refusal = f"attempt {claimed} belongs to another consumer"
    else:  # its own current attempt, on a finished entry
        return WorkOutcome(False, current.attempt, current.state)  # fenced
    return WorkOutcome(False, current.attempt, current.state, refusal)


@dataclass(frozen=True, slots=True)
class WorkEvidence:
    """What the assignment rows tell a scan, per stream: entries whose recorded attempts reached
    RIG_MAX_DELIVERIES (`worn`), and rule 4b's progress evidence."""

    worn: dict[StreamKey, dict[EntryId, int]] = field(default_factory=dict)
    progress: dict[StreamKey, Progress] = field(default_factory=dict)


# Unfinished entries of the scanned streams that are worn out, or whose current attempt has a
# progress time (WORK_STARTED, WORK_PROGRESS, or the reclaim that reserved it): one query.
_WORK_EVIDENCE = text(
    """
    SELECT stream, entry_id, attempt, progress_at > now() - make_interval(secs => :deadline_s)
      FROM assignments
     WHERE tenant = :tenant AND stream = ANY(CAST(:streams AS text[]))
       AND state NOT IN ('done', 'dead', 'superseded')
       AND (attempt >= :worn_at OR (:deadline_s > 0 AND progress_at IS NOT NULL))
    """
)


async def load_work_evidence(
    engine: AsyncEngine,
    *,
    tenant: str,
    streams: Sequence[str],
    worn_at: int,
    deadline_ms: int,
) -> WorkEvidence:
    """Worn attempts and progress of unfinished entries of `streams`, in one query.

    `deadline_ms` 0 turns rule 4b off: no progress is loaded.
    """
    if not streams:
        return WorkEvidence()
    params = {
        "tenant": tenant,
        "streams": list(streams),
        "worn_at": worn_at,
        "deadline_s": deadline_ms / 1000,
    }
    worn: dict[StreamKey, dict[EntryId, int]] = {}
    fresh: dict[StreamKey, set[EntryId]] = {}
    stale: dict[StreamKey, set[EntryId]] = {}
    async with engine.connect() as conn:
        rows = await conn.execute(_WORK_EVIDENCE, params)
        for stream, entry_id, attempt, progressed in rows:
            key, entry = StreamKey(stream), EntryId(entry_id)
            if attempt >= worn_at:
                worn.setdefault(key, {})[entry] = attempt
            if deadline_ms > 0 and progressed is not None:
                (fresh if progressed else stale).setdefault(key, set()).add(entry)
    progress = {
        key: Progress(frozenset(fresh.get(key, ())), frozenset(stale.get(key, ())))
        for key in fresh.keys() | stale.keys()
    }
    return WorkEvidence(worn, progress)


async def reclaimed(
    engine: AsyncEngine, *, tenant: str, stream: str, consumer: str, entry_ids: Sequence[str]
) -> None:
    """A reclaim opens a new attempt reserved for the target: the old owner is fenced off now,
    before the target even starts. Entries nobody reported on have no row and need none."""
    if not entry_ids:
        return
    # Stream ids hold no commas: one joined string is far cheaper to send than a large array.
    # Measured (2026-11-27, 20,000 ids): 0.6-1.2 ms joined and split by string_to_array, 2.7-4.5
    # ms as a text[] parameter that psycopg adapts.
    statement = text(
        """
        UPDATE assignments SET attempt = attempt + 1, state = 'pending', consumer = :consumer,
               updated_at = now(), progress_at = now()
         WHERE tenant = :tenant AND stream = :stream
           AND entry_id = ANY(string_to_array(:ids, ','))
           AND state NOT IN ('done', 'dead', 'superseded')
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
