"""What the applier records in PostgreSQL: the event-log rows of moves and dead letters, and the
new attempt of each moved entry (fencing its old owner off). Writes rows; decides nothing and
logs nothing (the `[StreamReclaim]` lines are `effects.apply`'s).

One RECLAIMED row per page of moved entries, one DEAD_LETTERED row per dead letter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import DEAD_LETTER_REASON, AgentId, ConsumerName, EntryId, EventKind
from rig_conductor.policy import reclaim

# Wraps the work of one phase (`claim`, `log`, `record`, ...) to time it for the scan report.
Timing = Callable[[str], AbstractContextManager[None]]
PAGE = 1_000  # moved entries per RECLAIMED row, and per log record
RECORD_BATCH = 20_000  # moved entries per write to PostgreSQL while a sweep goes on


def no_timing(phase: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


def pages(ids: list[EntryId]) -> Iterator[list[EntryId]]:
    """`ids` a page (`PAGE`) at a time: a RECLAIMED row each, a log record each."""
    for start in range(0, len(ids), PAGE):
        yield ids[start : start + PAGE]


@dataclass(frozen=True, slots=True)
class Journal:
    """Where effects are recorded: the event log and the assignments of `tenant`. `by` names the
    operator who asked for them (a move from the console); None for the reaper's scan."""

    engine: AsyncEngine
    tenant: str
    by: str | None = None


class Recorder:
    """Records a group's moves as they happen: one RECLAIMED row per page of a stretch, and the
    new attempt of each moved entry.

    PostgreSQL is written while the sweep goes on, `RECORD_BATCH` moved entries a write (one
    COPY and one UPDATE per target), one write at a time, so the event log keeps pace with Redis
    without a transaction per stretch. `close` writes the rest and raises what a write raised.
    """

    def __init__(
        self,
        assessment: reclaim.GroupAssessment,
        journal: Journal,
        *,
        agents: Mapping[ConsumerName, AgentId | None],
        timing: Timing,
    ) -> None:
        self._assessment = assessment
        self._journal = journal
        self._agents = agents
        self._timing = timing
        self._waiting: list[_Moved] = []
        self._count = 0
        self._writing: asyncio.Task[None] | None = None

    def moved(self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]) -> None:
        self._waiting.append(_Moved(owner, target, ids))
        self._count += len(ids)
        if self._count >= RECORD_BATCH and (self._writing is None or self._writing.done()):
            self._writing = asyncio.create_task(self._write(self._writing))

    async def close(self) -> None:
        await self._write(self._writing)

    async def _write(self, before: asyncio.Task[None] | None) -> None:
        if before is not None:
            await before  # a failed write fails the next one too: nothing is written twice
        moved, self._waiting, self._count = self._waiting, [], 0
        if moved:
            with self._timing("record"):
                await self._record(moved)

    async def _record(self, moved: list[_Moved]) -> None:
        assessment, journal = self._assessment, self._journal
        rows = [row for m in moved for row in self._rows(*m)]
        await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=rows)
        by_target: dict[ConsumerName, list[EntryId]] = {}
        for m in moved:
            by_target.setdefault(m.target, []).extend(m.ids)
        for target, ids in by_target.items():
            await pg_writes.reclaimed(
                journal.engine,
                tenant=journal.tenant,
                stream=assessment.stream,
                group=assessment.group,
                consumer=target,
                entry_ids=ids,
            )
        await pg_writes.record_move_targets(
            journal.engine,
            tenant=journal.tenant,
            targets=[(assessment.stream, assessment.group, target) for target in by_target],
        )

    def _rows(
        self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]
    ) -> list[queries.EventRow]:
        """One RECLAIMED row per page of a stretch, the page's ids in `entry_ids`: why the owner
        lost them (the scan's evidence), or who moved them (an operator).

        A row per entry would make PostgreSQL, not Redis, the limit of a large reclaim.
        """
        rule, by = self._assessment.rules[owner], self._journal.by
        why: dict[str, object]
        if by is None:
            last_beat = rule.last_heartbeat_at
            why = {
                "reasons": [reason.value for reason in rule.down_reasons],
                "lastHeartbeatAt": last_beat.isoformat() if last_beat else None,
            }
        else:
            why = {"by": by}
        rows: list[queries.EventRow] = []
        for batch in pages(ids):
            detail = {
                "toConsumer": target,
                "toAgent": self._agents.get(target),
                "reason": rule.reason,
                **why,
                "count": len(batch),
            }
            rows.append(
                queries.EventRow(
                    EventKind.RECLAIMED,
                    agent_id=rule.agent,
                    consumer=owner,
                    stream=self._assessment.stream,
                    group_name=self._assessment.group,
                    detail=json.dumps(detail),
                    entry_ids="{" + ",".join(batch) + "}",
                )
            )
        return rows


class _Moved(NamedTuple):
    owner: ConsumerName
    target: ConsumerName
    ids: list[EntryId]


async def record_dead_letters(
    journal: Journal,
    assessment: reclaim.GroupAssessment,
    dead: list[redis_streams.DeadLettered],
    *,
    owners: Mapping[EntryId, ConsumerName],
    dlq_stream: str,
) -> None:
    """A DEAD_LETTERED row per dead letter, and its assignment marked dead."""
    rows = dead_letter_rows(assessment, dead, owners=owners, dlq_stream=dlq_stream)
    await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=rows)
    entries = [(d.entry_id, d.issue_id, d.deliveries) for d in dead]
    await pg_writes.dead_lettered(
        journal.engine,
        tenant=journal.tenant,
        stream=assessment.stream,
        group=assessment.group,
        entries=entries,
    )


def dead_letter_rows(
    assessment: reclaim.GroupAssessment,
    dead: list[redis_streams.DeadLettered],
    *,
    owners: Mapping[EntryId, ConsumerName],
    dlq_stream: str,
) -> list[queries.EventRow]:
    rows: list[queries.EventRow] = []
    for item in dead:
        consumer = owners[item.entry_id]
        detail = {
            "deliveries": item.deliveries,
            "reason": DEAD_LETTER_REASON,
            "dlqStream": dlq_stream,
            "dlqId": item.dlq_id,
        }
        rows.append(
            queries.EventRow(
                EventKind.DEAD_LETTERED,
                agent_id=assessment.rules[consumer].agent,
                consumer=consumer,
                stream=assessment.stream,
                group_name=assessment.group,
                entry_id=item.entry_id,
                issue_id=item.issue_id,
                detail=json.dumps(detail),
            )
        )
    return rows


async def scan_requested(journal: Journal, summary: Mapping[str, object]) -> None:
    """The SCAN_REQUESTED row of a scan an operator ran from the console, naming who."""
    row = queries.EventRow(
        EventKind.SCAN_REQUESTED, detail=json.dumps({"by": journal.by, **summary})
    )
    await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=[row])
