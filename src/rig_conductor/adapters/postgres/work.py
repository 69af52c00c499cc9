"""Dispatch records and per-entry assignment state: the conditional updates behind
idempotent dispatch and attempt fencing. Decides nothing beyond what each statement guards."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres import lanes, recovery
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import (
    AssignmentState,
    EntryId,
    EventKind,
    GroupName,
    Progress,
    StagedOutput,
    StreamKey,
)

WorkKind = Literal[
    EventKind.WORK_STARTED,
    EventKind.WORK_PROGRESS,
    EventKind.WORK_COMPLETED,
    EventKind.WORK_FAILED,
    EventKind.WORK_PUBLISHED,
]


@dataclass(frozen=True, slots=True)
class WorkReport:
    """A WORK_* event as an agent sent it."""

    kind: WorkKind
    agent_id: str
    stream: str
    entry_id: str
    consumer: str | None = None
    issue_id: str | None = None
    attempt: int | None = None
    error: str | None = None  # WORK_FAILED's error text
    # WORK_COMPLETED: the files the attempt staged, published once the completion is accepted.
    outputs: tuple[StagedOutput, ...] = ()
    # WORK_PUBLISHED: final paths whose staged file was found nowhere (neither staged nor
    # renamed): the completion cannot be published, and the entry runs again.
    missing: tuple[str, ...] = ()
    # WORK_PUBLISHED: the reporting consumer holds the entry (it need not own the attempt).
    held: bool = False
    # The group the entry was read in; None from an agent of the previous release whose group
    # could not be told (`lanes`).
    group: str | None = None


@dataclass(frozen=True, slots=True)
class WorkOutcome:
    accepted: bool  # False: fenced off (an outdated attempt), or refused (`refusal`)
    attempt: int  # the entry's current attempt after this report (0: none was ever started)
    state: str
    # Why the report was refused without being recorded: it did not come from the consumer
    # that owns the attempt it names. None for accepted and for fenced reports.
    refusal: str | None = None
    # A done entry's accepted outputs that are not published yet: whoever holds the entry
    # renames them onto their paths and reports WORK_PUBLISHED.
    outputs: tuple[StagedOutput, ...] = ()


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
        "group": report.group,
    }
    kind = (
        "UNPUBLISHABLE"
        if report.kind == EventKind.WORK_PUBLISHED and report.missing
        else report.kind
    )
    async with engine.begin() as conn:
        if report.kind == EventKind.WORK_STARTED:
            await recovery.wait_for_append(
                conn, tenant=tenant, stream=report.stream, issue_id=report.issue_id
            )
        lane = await lanes.lane_of(conn, params)
        row = (await conn.execute(lane.statement(kind), _parameters(report, params))).first()
        if row is None and lane is lanes.FIRST and report.kind == EventKind.WORK_STARTED:
            # Another group claimed the first lane since we looked: ours is the other one.
            lane = await lanes.lane_of(conn, params)
            if lane is lanes.OTHER:
                row = (await conn.execute(lane.statement(kind), params)).first()
        if row is None:
            outcome = await _not_applied(conn, lane, params, report)
            if outcome.refusal is not None:
                return outcome
        else:
            outcome = WorkOutcome(True, row.attempt, row.state, None, _unpublished(row))
        attempt = (
            outcome.attempt
            if report.kind == EventKind.WORK_STARTED and outcome.accepted
            else report.attempt
        )
        await conn.execute(
            events.insert().values(
                tenant=tenant,
                kind=report.kind,
                agent_id=report.agent_id,
                consumer=report.consumer,
                stream=report.stream,
                group_name=report.group,
                entry_id=report.entry_id,
                issue_id=report.issue_id,
                attempt=attempt,
                fenced=not outcome.accepted,
                detail=_detail(report),
            )
        )
    return outcome


def _parameters(report: WorkReport, params: dict[str, Any]) -> dict[str, Any]:
    if report.kind == EventKind.WORK_COMPLETED:
        return {**params, "outputs": encode_outputs(report.outputs)}
    if report.kind == EventKind.WORK_PUBLISHED:
        return {**params, "held": report.held}
    return params


def _detail(report: WorkReport) -> dict[str, Any]:
    detail: dict[str, Any] = {"error": report.error} if report.error else {}
    if report.outputs:
        detail["outputs"] = len(report.outputs)
    if report.missing:
        detail["missing"] = list(report.missing)
    return detail


def encode_outputs(outputs: Sequence[StagedOutput]) -> str | None:
    """The `outputs` column's JSON text; None (SQL NULL) when nothing was staged."""
    if not outputs:
        return None
    return json.dumps([{"staged": item.staged, "path": item.path} for item in outputs])


def decode_outputs(value: object) -> tuple[StagedOutput, ...]:
    """The `outputs` column as psycopg returns it (JSONB: a list of objects)."""
    if not isinstance(value, list):
        return ()
    return tuple(
        StagedOutput(str(item["staged"]), str(item["path"]))
        for item in value
        if isinstance(item, dict) and "staged" in item and "path" in item
    )


def _unpublished(row: Any) -> tuple[StagedOutput, ...]:
    """A done row's outputs still waiting for their rename; () for anything else."""
    if row.state != AssignmentState.DONE or row.published_at is not None:
        return ()
    return decode_outputs(row.outputs)


async def finished(
    engine: AsyncEngine, *, tenant: str, stream: str, group: str | None, entry_id: str
) -> WorkOutcome | None:
    """The entry's accepted completion in `group`, if it has one (its outputs when not yet
    published); None when it is not done there."""
    params = {"tenant": tenant, "stream": stream, "group": group, "entry_id": entry_id}
    async with engine.connect() as conn:
        lane = await lanes.lane_of(conn, params)
        row = (await conn.execute(lane.statement("DONE"), params)).first()
    if row is None:
        return None
    return WorkOutcome(False, row.attempt, row.state, None, _unpublished(row))


_ATTEMPT_GROUPS = text(
    """
    SELECT group_name FROM assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
       AND consumer = :consumer AND (CAST(:claimed AS integer) IS NULL OR attempt = :claimed)
    UNION ALL
    SELECT group_name FROM group_assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
       AND consumer = :consumer AND (CAST(:claimed AS integer) IS NULL OR attempt = :claimed)
    """
)


async def groups_of_attempt(
    engine: AsyncEngine,
    *,
    tenant: str,
    stream: str,
    entry_id: str,
    consumer: str,
    attempt: int | None,
) -> list[str | None]:
    """The groups in which `consumer` made `attempt` of the entry (None: a row from before
    groups were recorded)."""
    params = {
        "tenant": tenant,
        "stream": stream,
        "entry_id": entry_id,
        "consumer": consumer,
        "claimed": attempt,
    }
    async with engine.connect() as conn:
        return [group for (group,) in await conn.execute(_ATTEMPT_GROUPS, params)]


async def _not_applied(
    conn: AsyncConnection, lane: lanes.Lane, params: dict[str, Any], report: WorkReport
) -> WorkOutcome:
    """Why a report changed nothing: fenced (an older attempt, or a finished entry), or refused
    (not from the attempt's owner). A done entry's fenced answer carries its unpublished
    outputs: the holder that asked finishes the publish."""
    current = (await conn.execute(lane.statement("CURRENT"), params)).first()
    if current is None:
        return WorkOutcome(False, 0, "none", "no attempt of this entry was started")
    fenced = WorkOutcome(False, current.attempt, current.state, None, _unpublished(current))
    claimed = report.attempt
    if report.kind == EventKind.WORK_STARTED or claimed is None or claimed < current.attempt:
        return fenced
    if claimed > current.attempt:
        refusal = f"attempt {claimed} was never made (the current one is {current.attempt})"
    elif current.consumer != report.consumer and not (
        report.kind == EventKind.WORK_PUBLISHED and report.held
    ):
        refusal = f"attempt {claimed} belongs to another consumer"
    else:  # its own current attempt, on a finished entry (or a publish of one not done)
        return fenced
    return WorkOutcome(False, current.attempt, current.state, refusal)


# Evidence is kept per (stream, group); None: rows from before groups were recorded, which
# count for every group of their stream.
GroupKey = tuple[StreamKey, GroupName | None]


@dataclass(frozen=True, slots=True)
class WorkEvidence:
    """What the assignment rows tell a scan, per stream and group: entries whose recorded
    attempts reached RIG_MAX_DELIVERIES (`worn`), rule 4b's progress evidence, and done entries
    whose accepted outputs are not published yet (`finished`: never dead-lettered)."""

    worn: dict[GroupKey, dict[EntryId, int]] = field(default_factory=dict)
    progress: dict[GroupKey, Progress] = field(default_factory=dict)
    finished: dict[GroupKey, frozenset[EntryId]] = field(default_factory=dict)

    def of(
        self, stream: StreamKey, group: GroupName
    ) -> tuple[dict[EntryId, int], Progress | None, frozenset[EntryId]]:
        """The evidence about `group`'s work on `stream`: (worn, progress, finished)."""
        keys = ((stream, group), (stream, None))
        worn = {e: n for key in keys for e, n in self.worn.get(key, {}).items()}
        found = [self.progress[key] for key in keys if key in self.progress]
        progress = (
            Progress(
                frozenset().union(*(p.fresh for p in found)),
                frozenset().union(*(p.stale for p in found)),
            )
            if found
            else None
        )
        finished = frozenset().union(*(self.finished.get(key, frozenset()) for key in keys))
        return worn, progress, finished


# Unfinished entries of the scanned streams that are worn out, or whose current attempt has a
# progress time (WORK_STARTED, WORK_PROGRESS, or the reclaim that reserved it), and entries done
# within the last `settle_s` (their agent may not have acked them yet: work that ended is never
# stalled, rule 4b, docs/rules.md, though Redis's idle time for it says nothing of its progress),
# in one pass over each lane, whether their outputs are published yet or not (the agent that
# had its completion accepted publishes them next, then acks); then done entries with outputs
# still to publish (few, through the partial indexes), which a down owner's next holder
# publishes. The last column says which: 'open', 'done' or 'unpublished'.
_LANE = """
    SELECT stream, group_name, entry_id, attempt,
           progress_at > now() - make_interval(secs => :deadline_s),
           CASE WHEN state = 'done' THEN 'done' ELSE 'open' END
      FROM {table}
     WHERE tenant = :tenant AND stream = ANY(CAST(:streams AS text[]))
       AND ((state NOT IN ('done', 'dead', 'superseded')
             AND (attempt >= :worn_at OR (:deadline_s > 0 AND progress_at IS NOT NULL)))
         OR (:deadline_s > 0 AND state = 'done'
             AND updated_at > now() - make_interval(secs => :settle_s)))
"""
_UNPUBLISHED = """
    SELECT stream, group_name, entry_id, attempt, NULL, 'unpublished' FROM {table}
     WHERE tenant = :tenant AND stream = ANY(CAST(:streams AS text[]))
       AND outputs IS NOT NULL AND published_at IS NULL AND state = 'done'
"""
_WORK_EVIDENCE = text(
    " UNION ALL ".join(
        part.format(table=table)
        for part in (_LANE, _UNPUBLISHED)
        for table in ("assignments", "group_assignments")
    )
)


async def load_work_evidence(
    engine: AsyncEngine,
    *,
    tenant: str,
    streams: Sequence[str],
    worn_at: int,
    deadline_ms: int,
    settle_ms: int = 0,
) -> WorkEvidence:
    """Worn attempts and progress of unfinished entries of `streams`, and the done ones with
    outputs to publish, in one query. `deadline_ms` 0 turns rule 4b (docs/rules.md) off: none read.
    An entry done within `settle_ms` counts as progressing (its agent acks it next); one done
    longer ago and still pending is judged by its idle time, and moved: the target's start is
    answered "already done", and the target acks it.
    """
    if not streams:
        return WorkEvidence()
    params = {
        "tenant": tenant,
        "streams": list(streams),
        "worn_at": worn_at,
        "deadline_s": deadline_ms / 1000,
        "settle_s": settle_ms / 1000,
    }
    worn: dict[GroupKey, dict[EntryId, int]] = {}
    fresh: dict[GroupKey, set[EntryId]] = {}
    stale: dict[GroupKey, set[EntryId]] = {}
    finished: dict[GroupKey, set[EntryId]] = {}
    async with engine.connect() as conn:
        rows = await conn.execute(_WORK_EVIDENCE, params)
        for stream, group, entry_id, attempt, progressed, kind in rows:
            key = (StreamKey(stream), GroupName(group) if group is not None else None)
            entry = EntryId(entry_id)
            if kind == "unpublished":
                finished.setdefault(key, set()).add(entry)
                continue
            if kind == "done":
                fresh.setdefault(key, set()).add(entry)
                continue
            if attempt >= worn_at:
                worn.setdefault(key, {})[entry] = attempt
            if deadline_ms > 0 and progressed is not None:
                (fresh if progressed else stale).setdefault(key, set()).add(entry)
    progress = {
        key: Progress(frozenset(fresh.get(key, ())), frozenset(stale.get(key, ())))
        for key in fresh.keys() | stale.keys()
    }
    return WorkEvidence(worn, progress, {k: frozenset(v) for k, v in finished.items()})
