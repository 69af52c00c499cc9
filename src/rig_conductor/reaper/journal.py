"""What a scan writes about its moves: the `[StreamReclaim]` log lines and the event-log rows.

One INFO line per moved or dead-lettered entry (contract, reaper step 8), written a page at a
time; one RECLAIMED row per page of moved entries, one DEAD_LETTERED row per dead letter.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import NamedTuple

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import move_targets, queries, work
from rig_conductor.domain import DEAD_LETTER_REASON, AgentId, ConsumerName, EntryId, PendingEntry
from rig_conductor.policy import reclaim
from rig_conductor.reaper import moves

# The log lines keep the logger name they always had: operators filter on it.
logger = logging.getLogger("rig_conductor.reaper.cycle")

WOULD_RECLAIM = (
    "[StreamReclaim] DRY RUN: would reclaim {entryId} on {stream}: {fromConsumer} -> {toConsumer}"
    " ({reason})"
)
LOG_PAGE = 1_000  # moved entries per log record and per RECLAIMED row
RECORD_BATCH = 20_000  # moved entries per write to PostgreSQL while a sweep goes on


class Recorder:
    """Logs and records a group's moves as they happen: one INFO line per moved entry (written
    a page at a time, `logs.log_lines`), one RECLAIMED row per page of a stretch, and the new
    attempt of each moved entry (fencing the old owner off).

    PostgreSQL is written while the sweep goes on, `RECORD_BATCH` moved entries a write (one
    COPY and one UPDATE per target), one write at a time, so the event log keeps pace with Redis
    without a transaction per stretch. `close` writes the rest and raises what a write raised.
    """

    def __init__(
        self,
        assessment: reclaim.GroupAssessment,
        *,
        engine: AsyncEngine,
        tenant: str,
        timing: moves.Timing,
    ) -> None:
        self._assessment = assessment
        self._agents = {t.consumer: t.agent for t in assessment.targets}
        self._engine = engine
        self._tenant = tenant
        self._timing = timing
        self._waiting: list[_Moved] = []
        self._count = 0
        self._writing: asyncio.Task[None] | None = None

    def moved(self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]) -> None:
        with self._timing("log"):
            _log_moved(self._assessment, self._agents, owner, target, ids)
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
        assessment = self._assessment
        rows = [row for m in moved for row in _reclaim_rows(assessment, self._agents, *m)]
        await queries.append_events(self._engine, tenant=self._tenant, rows=rows)
        by_target: dict[ConsumerName, list[EntryId]] = {}
        for m in moved:
            by_target.setdefault(m.target, []).extend(m.ids)
        for target, ids in by_target.items():
            await work.reclaimed(
                self._engine,
                tenant=self._tenant,
                stream=assessment.stream,
                consumer=target,
                entry_ids=ids,
            )
        await move_targets.record(
            self._engine,
            tenant=self._tenant,
            targets=[(assessment.stream, assessment.group, target) for target in by_target],
        )


class _Moved(NamedTuple):
    owner: ConsumerName
    target: ConsumerName
    ids: list[EntryId]


def _log_moved(
    assessment: reclaim.GroupAssessment,
    agents: Mapping[ConsumerName, AgentId | None],
    owner: ConsumerName,
    target: ConsumerName,
    ids: list[EntryId],
) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    rule = assessment.rules[owner]
    common = {
        "stream": assessment.stream,
        "group": assessment.group,
        "fromConsumer": owner,
        "toConsumer": target,
        "fromAgent": rule.agent,
        "toAgent": agents.get(target),
        "reason": rule.reason,
    }
    for start in range(0, len(ids), LOG_PAGE):
        batch = ids[start : start + LOG_PAGE]
        lines = logs.Lines.filled(logs.RECLAIMED, "entryId", batch, common)
        logs.log_lines(logger, logging.INFO, lines)


def _reclaim_rows(
    assessment: reclaim.GroupAssessment,
    agents: Mapping[ConsumerName, AgentId | None],
    owner: ConsumerName,
    target: ConsumerName,
    ids: list[EntryId],
) -> list[queries.EventRow]:
    """One RECLAIMED row per page of a stretch, the page's ids in `entry_ids`.

    A row per entry would make PostgreSQL, not Redis, the limit of a large reclaim.
    """
    rule = assessment.rules[owner]
    last_beat = rule.last_heartbeat_at
    rows: list[queries.EventRow] = []
    for start in range(0, len(ids), LOG_PAGE):
        batch = ids[start : start + LOG_PAGE]
        detail = {
            "toConsumer": target,
            "toAgent": agents.get(target),
            "reason": rule.reason,
            "reasons": [reason.value for reason in rule.down_reasons],
            "lastHeartbeatAt": last_beat.isoformat() if last_beat else None,
            "count": len(batch),
        }
        rows.append(
            queries.EventRow(
                "RECLAIMED",
                agent_id=rule.agent,
                consumer=owner,
                stream=assessment.stream,
                group_name=assessment.group,
                detail=json.dumps(detail),
                entry_ids="{" + ",".join(batch) + "}",
            )
        )
    return rows


def dead_letter_rows(
    assessment: reclaim.GroupAssessment,
    worn: list[PendingEntry],
    done: list[redis_streams.DeadLettered],
    dlq_stream: str,
) -> list[queries.EventRow]:
    owners = {entry.id: entry.consumer for entry in worn}
    rows: list[queries.EventRow] = []
    for item in done:
        consumer = owners[item.entry_id]
        detail = {
            "deliveries": item.deliveries,
            "reason": DEAD_LETTER_REASON,
            "dlqStream": dlq_stream,
            "dlqId": item.dlq_id,
        }
        rows.append(
            queries.EventRow(
                "DEAD_LETTERED",
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


def log_held(assessment: reclaim.GroupAssessment) -> None:
    for consumer, count in assessment.held.items():
        logger.warning(
            "[StreamReclaim] %s in group %s of %s has been degraded past the grace period, but "
            "no non-degraded consumer can take its %d entries; left in place",
            consumer,
            assessment.group,
            assessment.stream,
            count,
            extra={
                "stream": assessment.stream,
                "group": assessment.group,
                "fromConsumer": consumer,
                "entries": count,
                "reason": "degraded",
            },
        )


def log_no_target(assessment: reclaim.GroupAssessment, held: Mapping[ConsumerName, int]) -> None:
    for consumer, count in held.items():
        logger.warning(
            "[StreamReclaim] No live consumer in group %s of %s to take %d entries of %s; "
            "left in place",
            assessment.group,
            assessment.stream,
            count,
            consumer,
            extra={
                "stream": assessment.stream,
                "group": assessment.group,
                "fromConsumer": consumer,
                "entries": count,
                "reason": assessment.rules[consumer].reason,
            },
        )


def log_would_dead_letter(assessment: reclaim.GroupAssessment, worn: list[PendingEntry]) -> None:
    for entry in worn:
        logger.info(
            "[StreamReclaim] DRY RUN: would dead-letter %s on %s after %d deliveries",
            entry.id,
            assessment.stream,
            entry.deliveries,
        )


def log_would_move(
    assessment: reclaim.GroupAssessment,
    owner: ConsumerName,
    target: ConsumerName,
    ids: list[EntryId],
) -> None:
    """A dry run's line per entry it would move, a page at a time."""
    if not logger.isEnabledFor(logging.INFO):
        return
    reason = assessment.rules[owner].reason
    parts = {"stream": assessment.stream, "fromConsumer": owner, "toConsumer": target}
    for start in range(0, len(ids), LOG_PAGE):
        batch = ids[start : start + LOG_PAGE]
        sentences = logs.Framed.of(WOULD_RECLAIM, "entryId", batch, reason=reason, **parts)
        logs.log_lines(logger, logging.INFO, logs.Lines(sentences, {"reason": reason}))
