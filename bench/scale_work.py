"""The work history of `bench/scale.py`'s fleet: one issue with a long story, and tens of
thousands of finished issues before it, so the views that read the event log read a large one.

The long story (`story`) goes through the conductor's own write path: the dispatch's append and
record (`redis_writes.append_once`, `dispatches.record_dispatch`), every state change as an
agent's report (`work.record_work`), a move as the reaper makes it (XCLAIM,
`pg_writes.reclaimed`, the RECLAIMED row, `pg_writes.record_move_targets`). Its entry is read
by every group of its stream, and the groups' holders report progress in turn: 10,000
WORK_PROGRESS rows of which no two in a row belong to one attempt, so none fold into a run and
the timeline runs to 10,013 items. The bulk of those rows, and the finished history
(`history`), are written by COPY in the shape `record_work` and the journal give them. It
measures nothing, and decides nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import harness
from harness import TENANT, BenchError, Stores
from rig_conductor.adapters.postgres import dispatches, queries, work
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import DEAD_LETTER_REASON, ConsumerName, GroupName, StreamKey

STORY_ISSUE = "scale-story"
STORY_PROGRESS = 10_000  # its WORK_PROGRESS rows, all told
HISTORY = 50_000  # finished issues before it, their entries long trimmed from Redis
HISTORY_SPAN = timedelta(days=1)
REMEMBER_S = 30 * 86_400  # the dispatch's idempotency marker (RIG_EVENT_RETENTION_DAYS)
_EVENT_COLUMNS = ("occurred_at", "tenant", *queries.EventRow._fields)
_ASSIGNMENT_COLUMNS = (
    "tenant, stream, entry_id, issue_id, state, consumer, attempt, updated_at, progress_at, "
    "group_name, published_at"
)
_DISPATCH_COLUMNS = (
    "tenant, idempotency_key, stream, entry_id, issue_id, agent_id, created_at, fields"
)


@dataclass(frozen=True)
class Worker:
    """A consumer of one group of the stream, and its agent."""

    group: str
    consumer: str
    agent: str


@dataclass(frozen=True)
class Story:
    issue_id: str
    stream: str
    entry_id: str
    held: int  # groups whose pending list holds its entry
    progress: int  # its WORK_PROGRESS rows
    items: int  # its timeline's items: no progress folds


@dataclass(frozen=True)
class Place:
    """Where a finished issue ran: its stream, the worker of its first attempt, the one a
    reclaim gave it to, and whether it came through the conductor's dispatch."""

    stream: str
    worker: Worker
    other: Worker
    dispatched: bool


async def story(stores: Stores, *, stream: str, holders: Sequence[Worker], zombie: Worker) -> Story:
    """The issue dispatched to `stream`, read first by `zombie` (of the first holder's group),
    which stalls and is moved to `holders[0]`; each other holder reads it in its own group. Then
    progress in turn until STORY_PROGRESS rows: the zombie's late report among them, fenced."""
    redis, engine = stores.redis, stores.engine
    fields = {
        "type": "ISSUE_ASSIGNED",
        "issueId": STORY_ISSUE,
        "agentId": zombie.agent,
        "payload": json.dumps({"repo": "rig/conductor", "pr": 43, "kind": "review"}),
        "assignedAt": datetime.now(UTC).isoformat(),
    }
    entry, _ = await redis_writes.append_once(
        redis, stream=StreamKey(stream), key=STORY_ISSUE, fields=fields, remember_s=REMEMBER_S
    )
    await dispatches.record_dispatch(
        engine,
        tenant=TENANT,
        key=STORY_ISSUE,
        issue_id=STORY_ISSUE,
        agent_id=zombie.agent,
        stream=stream,
        entry_id=entry,
        fields=fields,
    )
    report = _Reporter(engine, stream, entry)
    first = holders[0]
    await _read(redis, stream, zombie, entry)
    await report("WORK_STARTED", zombie, expect=1)
    await report("WORK_PROGRESS", zombie, attempt=1, expect=1)
    await _stalled(stores, stream, entry, zombie, first)
    attempts = {first: await report("WORK_STARTED", first, expect=2)}
    await report("WORK_PROGRESS", zombie, attempt=1, expect=2, fenced=True)
    for holder in holders[1:]:
        await _read(redis, stream, holder, entry)
        attempts[holder] = await report("WORK_STARTED", holder, expect=1)
    # In turn: no two rows in a row of one attempt. The last round goes through record_work,
    # which leaves each attempt's progress time fresh (reaper rule 4b).
    bulk = STORY_PROGRESS - 2 - len(holders)
    turns = [holders[n % len(holders)] for n in range(bulk + len(holders))]
    rows = [_progress(by, stream, entry, attempts[by]) for by in turns[:bulk]]
    await pg_writes.append_events(engine, tenant=TENANT, rows=rows)
    for by in turns[bulk:]:
        await report("WORK_PROGRESS", by, attempt=attempts[by], expect=attempts[by])
    # Every row an item of the timeline, and the RECLAIMED one, which names the entry in its batch.
    told = Story(STORY_ISSUE, stream, entry, len(holders), STORY_PROGRESS, report.rows + bulk + 1)
    await _check_story(engine, told)
    return told


class _Reporter:
    """WORK_* reports on one entry through `work.record_work`, each checked: the attempt the
    conductor answers, fenced or not. Counts the rows written."""

    def __init__(self, engine: AsyncEngine, stream: str, entry: str) -> None:
        self.engine, self.stream, self.entry = engine, stream, entry
        self.rows = 1  # the dispatch's

    async def __call__(
        self,
        kind: work.WorkKind,
        by: Worker,
        *,
        expect: int,
        attempt: int | None = None,
        fenced: bool = False,
    ) -> int:
        outcome = await work.record_work(
            self.engine,
            tenant=TENANT,
            report=work.WorkReport(
                kind,
                agent_id=by.agent,
                stream=self.stream,
                entry_id=self.entry,
                consumer=by.consumer,
                issue_id=STORY_ISSUE,
                attempt=attempt,
                group=by.group,
            ),
        )
        if outcome.accepted == fenced or outcome.attempt != expect:
            raise BenchError(f"{kind} of {by.consumer}: {outcome}, expected attempt {expect}")
        self.rows += 1
        return outcome.attempt


async def _read(redis: Redis, stream: str, by: Worker, entry: str) -> None:
    reply = await redis.xreadgroup(by.group, by.consumer, {stream: ">"}, count=1)
    got = [entry_id for _, entries in reply for entry_id, _ in entries]
    if got != [entry]:
        raise BenchError(f"{by.consumer} read {got} in {by.group}, expected [{entry}]")


async def _stalled(stores: Stores, stream: str, entry: str, owner: Worker, to: Worker) -> None:
    """A move of reaper rule 4b, written as the reaper's journal writes it."""
    moved = await stores.redis.xclaim(stream, owner.group, to.consumer, 0, [entry], justid=True)
    if len(moved) != 1:
        raise BenchError(f"XCLAIM of {entry} to {to.consumer} moved {moved}")
    await pg_writes.reclaimed(
        stores.engine,
        tenant=TENANT,
        stream=stream,
        group=owner.group,
        consumer=to.consumer,
        entry_ids=[entry],
    )
    row = queries.EventRow(
        "RECLAIMED",
        agent_id=owner.agent,
        consumer=owner.consumer,
        stream=stream,
        group_name=owner.group,
        detail=_moved(to, "stalled", datetime.now(UTC)),
        entry_ids="{" + entry + "}",
    )
    await pg_writes.append_events(stores.engine, tenant=TENANT, rows=[row])
    targets = [(StreamKey(stream), GroupName(to.group), ConsumerName(to.consumer))]
    await pg_writes.record_move_targets(stores.engine, tenant=TENANT, targets=targets)


def _progress(by: Worker, stream: str, entry: str, attempt: int) -> queries.EventRow:
    """A WORK_PROGRESS row as `record_work` writes an accepted one."""
    return queries.EventRow(
        "WORK_PROGRESS",
        agent_id=by.agent,
        consumer=by.consumer,
        stream=stream,
        group_name=by.group,
        entry_id=entry,
        issue_id=STORY_ISSUE,
        attempt=attempt,
    )


async def _check_story(engine: AsyncEngine, told: Story) -> None:
    query = (
        "SELECT count(*) FILTER (WHERE kind = 'WORK_PROGRESS'), count(*) FROM events "
        "WHERE stream = :stream AND entry_id = :entry"
    )
    async with engine.connect() as conn:
        found = await conn.execute(text(query), {"stream": told.stream, "entry": told.entry_id})
        progress, rows = found.one()
    if (progress, rows) != (told.progress, told.items - 1):
        raise BenchError(f"the story's log: {progress} progress rows of {rows}, expected {told}")


async def history(
    database_url: str, *, issues: int, place: Callable[[int], Place], before: datetime
) -> int:
    """`issues` finished issues spread over HISTORY_SPAN up to `before`, each issue's rows a
    moment apart: events, assignment rows and, for those dispatched, dispatch rows. Each is
    finished: most completed at attempt 1 after 0-3 progress reports; 1 in 20 failed, was moved
    on as stalled and completed at attempt 2; 1 in 20 was reclaimed from an owner that looked
    down and completed at attempt 2 (the owner's late completion fenced); 1 in 2,000 was
    dead-lettered. The event rows written."""
    start = before - HISTORY_SPAN
    step = HISTORY_SPAN / issues
    written = 0
    async with await psycopg.AsyncConnection.connect(harness.conninfo(database_url)) as conn:
        async with conn.cursor() as cur:
            events_sql = f"COPY events ({', '.join(_EVENT_COLUMNS)}) FROM STDIN"
            async with cur.copy(events_sql) as copy:
                for n in range(issues):
                    for row in _issue_events(n, place(n), start + n * step):
                        await copy.write_row(row)
                        written += 1
            async with cur.copy(f"COPY assignments ({_ASSIGNMENT_COLUMNS}) FROM STDIN") as copy:
                for n in range(issues):
                    await copy.write_row(_assignment(n, place(n), start + n * step))
            async with cur.copy(f"COPY dispatches ({_DISPATCH_COLUMNS}) FROM STDIN") as copy:
                for n in range(issues):
                    if place(n).dispatched:
                        await copy.write_row(_dispatch(n, place(n), start + n * step))
        await conn.commit()
    return written


async def analyze(database_url: str) -> None:
    """Statistics of the tables the work was loaded into. Autovacuum gathers them within a
    minute or so of a load like this, which a short run may or may not outlast: the plans
    measured are those of a log with its statistics, as a log that grew over a day has them."""
    async with await psycopg.AsyncConnection.connect(harness.conninfo(database_url)) as conn:
        for table in ("events", "assignments", "group_assignments", "dispatches"):
            await conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
        await conn.commit()


def _issue(n: int) -> str:
    return f"scale-{n}"


def _entry(at: datetime) -> str:
    return f"{int(at.timestamp() * 1000)}-0"


def _fate(n: int) -> str:
    """done; failed (left pending), moved on by rule 4b and done at attempt 2; reclaimed from an
    owner gone down and done at attempt 2; dead-lettered."""
    if n % 2000 == 0:
        return "dead"
    return {0: "reclaimed", 1: "failed"}.get(n % 20, "done")


def _issue_events(n: int, where: Place, at: datetime) -> Iterator[tuple[Any, ...]]:
    """The issue's rows as the dispatch, `record_work` and the journal write them."""
    issue, entry, fate = _issue(n), _entry(at), _fate(n)
    first, other = where.worker, where.other

    def row(kind: str, by: Worker, attempt: int | None, **rest: Any) -> queries.EventRow:
        return queries.EventRow(
            kind,
            agent_id=by.agent,
            consumer=by.consumer,
            stream=where.stream,
            group_name=by.group,
            entry_id=entry,
            issue_id=issue,
            attempt=attempt,
            **rest,
        )

    rows: list[queries.EventRow] = []
    if where.dispatched:
        key = json.dumps({"idempotencyKey": issue})
        rows.append(
            queries.EventRow(
                "ISSUE_ASSIGNED",
                agent_id=first.agent,
                stream=where.stream,
                entry_id=entry,
                issue_id=issue,
                detail=key,
            )
        )
    rows.append(row("WORK_STARTED", first, 1))
    rows += [row("WORK_PROGRESS", first, 1) for _ in range(n % 4)]
    if fate == "done":
        rows.append(row("WORK_COMPLETED", first, 1))
    else:
        if fate == "failed":
            failed = json.dumps({"error": "exit status 1"})
            rows.append(row("WORK_FAILED", first, 1, detail=failed))
        reason = "stalled" if fate == "failed" else "down"
        moved = row("RECLAIMED", first, None, detail=_moved(other, reason, at))
        rows.append(moved._replace(entry_id=None, issue_id=None, entry_ids="{" + entry + "}"))
        rows.append(row("WORK_STARTED", other, 2))
        if fate == "dead":
            dead = {"deliveries": 5, "reason": DEAD_LETTER_REASON}
            dead["dlqStream"] = f"{where.stream}:dlq"
            rows.append(row("DEAD_LETTERED", other, None, detail=json.dumps(dead)))
        else:
            rows.append(row("WORK_COMPLETED", other, 2))
        if fate == "reclaimed":  # the owner was not dead after all: its late completion
            rows.append(row("WORK_COMPLETED", first, 1, fenced=True))
    for k, event in enumerate(rows):
        yield (at + timedelta(milliseconds=150 * k), TENANT, *event)


def _moved(to: Worker, reason: str, at: datetime) -> str:
    """A RECLAIMED row's detail, as the journal writes a scan's move of one entry."""
    reasons = ["agent-heartbeat-stale"] if reason == "down" else []
    detail: dict[str, object] = {"toConsumer": to.consumer, "toAgent": to.agent, "reason": reason}
    detail |= {"reasons": reasons, "lastHeartbeatAt": at.isoformat(), "count": 1}
    return json.dumps(detail)


def _assignment(n: int, where: Place, at: datetime) -> tuple[Any, ...]:
    fate = _fate(n)
    by, attempt = (where.worker, 1) if fate == "done" else (where.other, 2)
    state = "dead" if fate == "dead" else "done"
    ended = at + timedelta(seconds=1)
    published = ended if state == "done" else None
    return (
        TENANT,
        where.stream,
        _entry(at),
        _issue(n),
        state,
        by.consumer,
        attempt,
        ended,
        ended,
        where.worker.group,
        published,
    )


def _dispatch(n: int, where: Place, at: datetime) -> tuple[Any, ...]:
    issue = _issue(n)
    fields = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": where.worker.agent}
    fields |= {
        "payload": json.dumps({"repo": "rig/conductor", "pr": n}),
        "assignedAt": at.isoformat(),
    }
    return (
        TENANT,
        issue,
        where.stream,
        _entry(at),
        issue,
        where.worker.agent,
        at,
        json.dumps(fields),
    )
