"""One reaper scan: fetch -> plan -> apply -> report.

The decisions are `policy.reclaim`'s: which consumers are down, the target, and each down
consumer's entry rule. This module moves data between the adapters and the policy, has the
Redis adapter apply the entry rules where the pending lists live, writes the `[StreamReclaim]`
log lines and records what it did in the event log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.domain import ConsumerName, EntryId, PendingEntry, PodState
from rig_conductor.metrics import UNKNOWN_AGENT, Metrics
from rig_conductor.policy import liveness, reclaim
from rig_conductor.reaper import observe
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

DEAD_LETTER_REASON = "max-deliveries"


@dataclass
class GroupOutcome:
    """What a scan did (or, in a dry run, would do) in one group with down consumers."""

    stream: str
    group: str
    target: str | None
    reclaimed: int = 0
    dead_lettered: int = 0
    no_target: int = 0
    skipped: int = 0
    # Per owner, the entries moved off it: for the log lines, the event log and the metrics.
    moved: dict[ConsumerName, list[EntryId]] = field(default_factory=dict)
    # The entries dead-lettered, for the assignment rows.
    dead: list[redis_streams.DeadLettered] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "group": self.group,
            "target": self.target,
            "reclaimed": self.reclaimed,
            "deadLettered": self.dead_lettered,
            "noTarget": self.no_target,
            "skipped": self.skipped,
        }


@dataclass
class ScanReport:
    """What one scan saw and did. In a dry run the counts are what it would have done."""

    dry_run: bool
    streams: int = 0
    groups: int = 0
    pending: int = 0
    consumers_down: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    no_target: int = 0
    # Chosen, but acked, re-read, trimmed or claimed elsewhere before the move: left alone.
    skipped: int = 0
    # The detector's count: consumers holding entries with no fresh heartbeat behind them.
    without_heartbeat: int = 0
    duration_ms: int = 0
    per_group: list[GroupOutcome] = field(default_factory=list)

    def add(self, outcome: GroupOutcome) -> None:
        self.per_group.append(outcome)
        self.reclaimed += outcome.reclaimed
        self.dead_lettered += outcome.dead_lettered
        self.no_target += outcome.no_target
        self.skipped += outcome.skipped

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "groups": self.groups,
            "pending": self.pending,
            "consumersDown": self.consumers_down,
            "reclaimed": self.reclaimed,
            "deadLettered": self.dead_lettered,
            "noTarget": self.no_target,
            "skipped": self.skipped,
            "consumersWithoutHeartbeat": self.without_heartbeat,
            "dryRun": self.dry_run,
            "durationMs": self.duration_ms,
            "groupsDetail": [outcome.to_json() for outcome in self.per_group],
        }


async def reap_once(
    *,
    redis: Redis,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool | None = None,
    pods: Mapping[ConsumerName, PodState] | None = None,
    metrics: Metrics | None = None,
    detector: observe.Detector | None = None,
) -> ScanReport:
    """Scan every group of every configured stream once. Raises on Redis or Postgres failure.

    With `metrics`, counters and gauges are updated (not in a dry run: nothing moved); with
    `detector`, new sightings of consumers without heartbeat are logged and recorded.
    """
    started = time.perf_counter()
    limits = settings.limits
    report = ScanReport(dry_run=settings.dry_run if dry_run is None else dry_run)
    # Fetch.
    streams = await redis_streams.resolve_streams(redis, names=settings.streams)
    groups = await redis_streams.describe_groups(redis, streams=streams)
    evidence = await queries.load_evidence(
        engine, tenant=settings.tenant, configured_agents=settings.agent_ids, pods=pods
    )
    fleet = liveness.Fleet(evidence, limits)
    report.streams = len(streams)
    for group in groups:
        report.groups += 1
        report.pending += group.pending
        # Plan.
        assessment = reclaim.assess_group(group, fleet)
        if not assessment.down:
            continue
        report.consumers_down += len(assessment.down)
        attempts = await work.worn_attempts(
            engine, tenant=settings.tenant, stream=group.stream, at_least=limits.max_deliveries
        )
        rules = reclaim.entry_rules(assessment, limits, attempts)
        # Apply.
        outcome = await _apply(
            assessment,
            rules,
            redis=redis,
            engine=engine,
            tenant=settings.tenant,
            dry_run=report.dry_run,
        )
        report.add(outcome)
        if metrics is not None and not report.dry_run:
            _count(assessment, outcome, metrics)
    # Report.
    if (report.reclaimed or report.dead_lettered) and not report.dry_run:
        # Gauges and the detector describe what is left after the moves.
        groups = await redis_streams.describe_groups(redis, streams=streams)
    report.without_heartbeat = await observe.observe(
        groups=groups,
        fleet=fleet,
        redis=redis,
        engine=engine,
        tenant=settings.tenant,
        metrics=metrics,
        watch=detector,
    )
    report.duration_ms = round((time.perf_counter() - started) * 1000)
    return report


async def _apply(
    assessment: reclaim.GroupAssessment,
    rules: list[reclaim.EntryRule],
    *,
    redis: Redis,
    engine: AsyncEngine,
    tenant: str,
    dry_run: bool,
) -> GroupOutcome:
    target = assessment.target
    moving = target is not None and not dry_run
    swept = await redis_streams.sweep(
        redis,
        stream=assessment.stream,
        group=assessment.group,
        rules=[
            redis_streams.SweepRule(r.owner, r.min_idle_ms, r.max_deliveries, tuple(r.worn))
            for r in rules
        ],
        target=target.consumer if moving and target else None,
    )
    outcome = GroupOutcome(assessment.stream, assessment.group, target.consumer if target else None)
    worn = [
        entry._replace(deliveries=max(entry.deliveries, rule.worn.get(entry.id, 0)))
        for rule in rules
        for entry in swept[rule.owner].worn
    ]
    if target is None:
        outcome.no_target = sum(len(s.moved) for s in swept.values())
        _log_no_target(assessment, {owner: len(s.moved) for owner, s in swept.items()})
    if dry_run:
        outcome.dead_lettered = len(worn)
        if target is not None:
            outcome.reclaimed = sum(len(s.moved) for s in swept.values())
        _log_dry_run(assessment, swept, worn)
        return outcome
    rows: list[queries.EventRow] = []
    if worn:
        rows += await _dead_letter(assessment, worn, redis=redis, outcome=outcome)
    if target is not None:
        outcome.moved = {owner: s.moved for owner, s in swept.items() if s.moved}
        outcome.reclaimed = sum(len(ids) for ids in outcome.moved.values())
        outcome.skipped += sum(s.movable for s in swept.values()) - outcome.reclaimed
        _log_moves(assessment, outcome)
        rows += _reclaim_rows(assessment, outcome)
    await _record(assessment, outcome, rows, engine=engine, tenant=tenant)
    return outcome


def _log_moves(assessment: reclaim.GroupAssessment, outcome: GroupOutcome) -> None:
    target = assessment.target
    assert target is not None
    if outcome.skipped:
        logger.info(
            "[StreamReclaim] Left %d entries on %s/%s: trimmed from the stream or touched since "
            "the scan looked",
            outcome.skipped,
            assessment.stream,
            assessment.group,
        )
    if not logger.isEnabledFor(logging.INFO):
        return
    stream, group = assessment.stream, assessment.group
    for owner, ids in outcome.moved.items():
        from_agent = assessment.down[owner].agent
        for entry_id in ids:
            logger.info(
                "[StreamReclaim] Reclaimed %s on %s: %s -> %s",
                entry_id,
                stream,
                owner,
                target.consumer,
                extra={
                    "entryId": entry_id,
                    "stream": stream,
                    "group": group,
                    "fromConsumer": owner,
                    "toConsumer": target.consumer,
                    "fromAgent": from_agent,
                    "toAgent": target.agent,
                },
            )


def _reclaim_rows(
    assessment: reclaim.GroupAssessment, outcome: GroupOutcome
) -> list[queries.EventRow]:
    """One RECLAIMED row per batch of up to a sweep page, the batch's ids in `entry_ids`.

    A row per entry would make PostgreSQL, not Redis, the limit of a large reclaim.
    """
    target = assessment.target
    assert target is not None
    rows: list[queries.EventRow] = []
    page = redis_streams.SWEEP_PAGE
    for owner, ids in outcome.moved.items():
        verdict = assessment.down[owner]
        last_beat = verdict.last_heartbeat_at
        for start in range(0, len(ids), page):
            batch = ids[start : start + page]
            detail = {
                "toConsumer": target.consumer,
                "toAgent": target.agent,
                "reasons": [reason.value for reason in verdict.reasons],
                "lastHeartbeatAt": last_beat.isoformat() if last_beat else None,
                "count": len(batch),
            }
            rows.append(
                queries.EventRow(
                    "RECLAIMED",
                    agent_id=verdict.agent,
                    consumer=owner,
                    stream=assessment.stream,
                    group_name=assessment.group,
                    detail=json.dumps(detail),
                    entry_ids="{" + ",".join(batch) + "}",
                )
            )
    return rows


async def _dead_letter(
    assessment: reclaim.GroupAssessment,
    worn: list[PendingEntry],
    *,
    redis: Redis,
    outcome: GroupOutcome,
) -> list[queries.EventRow]:
    stream, group = assessment.stream, assessment.group
    done = await redis_streams.dead_letter(
        redis, stream=stream, group=group, entries=worn, reason=DEAD_LETTER_REASON
    )
    outcome.dead = done
    outcome.dead_lettered = len(done)
    outcome.skipped += len(worn) - len(done)
    owners = {entry.id: entry.consumer for entry in worn}
    rows: list[queries.EventRow] = []
    for item in done:
        consumer = owners[item.entry_id]
        logger.info(
            "[StreamReclaim] Dead-lettered %s on %s after %d deliveries",
            item.entry_id,
            stream,
            item.deliveries,
            extra={
                "entryId": item.entry_id,
                "stream": stream,
                "group": group,
                "consumer": consumer,
                "deliveries": item.deliveries,
                "dlqId": item.dlq_id,
            },
        )
        detail = {
            "deliveries": item.deliveries,
            "reason": DEAD_LETTER_REASON,
            "dlqStream": redis_streams.dlq_key(stream),
            "dlqId": item.dlq_id,
        }
        rows.append(
            queries.EventRow(
                "DEAD_LETTERED",
                agent_id=assessment.down[consumer].agent,
                consumer=consumer,
                stream=stream,
                group_name=group,
                entry_id=item.entry_id,
                issue_id=item.issue_id,
                detail=json.dumps(detail),
            )
        )
    return rows


async def _record(
    assessment: reclaim.GroupAssessment,
    outcome: GroupOutcome,
    rows: list[queries.EventRow],
    *,
    engine: AsyncEngine,
    tenant: str,
) -> None:
    """The event log, and the assignment rows: moved entries get a new attempt (fencing the old
    owner off), dead letters are marked dead."""
    await queries.append_events(engine, tenant=tenant, rows=rows)
    target = assessment.target
    moved = [entry_id for ids in outcome.moved.values() for entry_id in ids]
    if moved and target is not None:
        await work.reclaimed(
            engine,
            tenant=tenant,
            stream=assessment.stream,
            consumer=target.consumer,
            entry_ids=moved,
        )
    dead = [(d.entry_id, d.issue_id, d.deliveries) for d in outcome.dead]
    await work.dead_lettered(engine, tenant=tenant, stream=assessment.stream, entries=dead)


def _count(assessment: reclaim.GroupAssessment, outcome: GroupOutcome, metrics: Metrics) -> None:
    stream, group = assessment.stream, assessment.group
    target = assessment.target
    to_agent = (target.agent if target else None) or UNKNOWN_AGENT
    for owner, ids in outcome.moved.items():
        from_agent = assessment.down[owner].agent or UNKNOWN_AGENT
        metrics.reclaimed.labels(stream, group, from_agent, to_agent).inc(len(ids))
    if outcome.dead_lettered:
        metrics.dead_lettered.labels(stream, group).inc(outcome.dead_lettered)
    if outcome.no_target:
        metrics.no_target.labels(stream, group).inc(outcome.no_target)


def _log_no_target(assessment: reclaim.GroupAssessment, held: Mapping[ConsumerName, int]) -> None:
    for consumer, count in held.items():
        if not count:
            continue
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
            },
        )


def _log_dry_run(
    assessment: reclaim.GroupAssessment,
    swept: Mapping[ConsumerName, redis_streams.Swept],
    worn: list[PendingEntry],
) -> None:
    stream = assessment.stream
    for entry in worn:
        logger.info(
            "[StreamReclaim] DRY RUN: would dead-letter %s on %s after %d deliveries",
            entry.id,
            stream,
            entry.deliveries,
        )
    if assessment.target is None or not logger.isEnabledFor(logging.INFO):
        return
    for owner, result in swept.items():
        for entry_id in result.moved:
            logger.info(
                "[StreamReclaim] DRY RUN: would reclaim %s on %s: %s -> %s",
                entry_id,
                stream,
                owner,
                assessment.target.consumer,
            )


def describe_failure(exc: BaseException) -> str:
    """One line for a failed scan that says which dependency failed."""
    if isinstance(exc, RedisError):
        return f"Redis unavailable or refused a command: {type(exc).__name__}: {exc}"
    if isinstance(exc, SQLAlchemyError | OSError):
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"PostgreSQL unavailable: {type(exc).__name__}: {detail}"
    return f"{type(exc).__name__}: {exc}"
