"""What a scan writes about its moves: the `[StreamReclaim]` log lines and the event-log rows.

One INFO line per moved or dead-lettered entry (contract, reaper step 8), written a page at a
time; one RECLAIMED row per batch of moved entries, one DEAD_LETTERED row per dead letter.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from rig_conductor import logs
from rig_conductor.adapters import redis_streams, redis_sweep
from rig_conductor.adapters.postgres import queries
from rig_conductor.domain import DEAD_LETTER_REASON, ConsumerName, PendingEntry
from rig_conductor.policy import reclaim
from rig_conductor.reaper import moves

# The log lines keep the logger name they always had: operators filter on it.
logger = logging.getLogger("rig_conductor.reaper.cycle")


def log_moves(assessment: reclaim.GroupAssessment, swept: moves.GroupSweep) -> None:
    """One INFO line per moved entry, written a page at a time (`logs.log_lines`)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    stream, group = assessment.stream, assessment.group
    agents = {t.consumer: t.agent for t in assessment.targets}
    page = redis_sweep.SWEEP_PAGE
    for (owner, target), ids in swept.moved.items():
        rule = assessment.rules[owner]
        common = {
            "stream": stream,
            "group": group,
            "fromConsumer": owner,
            "toConsumer": target,
            "fromAgent": rule.agent,
            "toAgent": agents.get(target),
            "reason": rule.reason,
        }
        tail = f" on {stream}: {owner} -> {target}"
        for start in range(0, len(ids), page):
            batch = ids[start : start + page]
            sentences = [f"[StreamReclaim] Reclaimed {entry_id}{tail}" for entry_id in batch]
            logs.log_lines(logger, logging.INFO, logs.Lines(sentences, common, ("entryId", batch)))


def reclaim_rows(
    assessment: reclaim.GroupAssessment, swept: moves.GroupSweep
) -> list[queries.EventRow]:
    """One RECLAIMED row per batch of up to a sweep page, the batch's ids in `entry_ids`.

    A row per entry would make PostgreSQL, not Redis, the limit of a large reclaim.
    """
    agents = {t.consumer: t.agent for t in assessment.targets}
    rows: list[queries.EventRow] = []
    page = redis_sweep.SWEEP_PAGE
    for (owner, target), ids in swept.moved.items():
        rule = assessment.rules[owner]
        last_beat = rule.last_heartbeat_at
        for start in range(0, len(ids), page):
            batch = ids[start : start + page]
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


def log_dry_run(assessment: reclaim.GroupAssessment, swept: moves.GroupSweep) -> None:
    stream = assessment.stream
    for entry in swept.worn:
        logger.info(
            "[StreamReclaim] DRY RUN: would dead-letter %s on %s after %d deliveries",
            entry.id,
            stream,
            entry.deliveries,
        )
    if not logger.isEnabledFor(logging.INFO):
        return
    for (owner, target), ids in swept.moved.items():
        reason = assessment.rules[owner].reason
        for entry_id in ids:
            logger.info(
                "[StreamReclaim] DRY RUN: would reclaim %s on %s: %s -> %s (%s)",
                entry_id,
                stream,
                owner,
                target,
                reason,
                extra={"reason": reason},
            )
