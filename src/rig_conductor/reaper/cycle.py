"""One reaper scan: fetch -> plan -> apply -> report.

The decisions are `policy.reclaim`'s; this module only moves data between the adapters and the
policy, writes the `[StreamReclaim]` log lines and records what it did in the event log.
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
from rig_conductor.domain import ConsumerName, PodState
from rig_conductor.metrics import UNKNOWN_AGENT, Metrics
from rig_conductor.policy import reclaim
from rig_conductor.reaper import observe
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

DEAD_LETTER_REASON = "max-deliveries"


@dataclass
class GroupOutcome:
    """What a scan did in one group that needed action."""

    stream: str
    group: str
    target: str | None
    reclaimed: int = 0
    dead_lettered: int = 0
    no_target: int = 0
    skipped: int = 0

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
    # Planned, but acked, re-read, trimmed or claimed elsewhere before the move: left alone.
    skipped: int = 0
    # The detector's count: consumers holding entries with no fresh heartbeat behind them.
    without_heartbeat: int = 0
    duration_ms: int = 0
    per_group: list[GroupOutcome] = field(default_factory=list)

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
    streams = await redis_streams.resolve_streams(redis, names=settings.streams)
    groups = await redis_streams.describe_groups(redis, streams=streams)
    evidence = await queries.load_evidence(
        engine, tenant=settings.tenant, configured_agents=settings.agent_ids, pods=pods
    )
    report.streams = len(streams)
    for group in groups:
        report.groups += 1
        report.pending += group.pending
        assessment = reclaim.assess_group(group, evidence, limits)
        if not assessment.down:
            continue
        report.consumers_down += len(assessment.down)
        entries = await redis_streams.pending_entries(
            redis,
            stream=group.stream,
            group=group.name,
            min_idle_ms={c: assessment.min_idle_ms(c, limits) for c in assessment.down},
        )
        attempts = await work.worn_attempts(
            engine, tenant=settings.tenant, stream=group.stream, at_least=limits.max_deliveries
        )
        plan = reclaim.plan_reclaims(assessment, entries, limits, attempts)
        if plan.empty:
            continue
        rows = await _apply(plan, redis=redis, report=report)
        await _record(plan, rows, engine=engine, tenant=settings.tenant)
        if metrics is not None and not report.dry_run:
            _count(plan, rows, report.per_group[-1], metrics)
    if (report.reclaimed or report.dead_lettered) and not report.dry_run:
        # Gauges and the detector describe what is left after the moves.
        groups = await redis_streams.describe_groups(redis, streams=streams)
    report.without_heartbeat = await observe.observe(
        groups=groups,
        evidence=evidence,
        limits=limits,
        redis=redis,
        engine=engine,
        tenant=settings.tenant,
        metrics=metrics,
        watch=detector,
    )
    report.duration_ms = round((time.perf_counter() - started) * 1000)
    return report


async def _apply(
    plan: reclaim.ReclaimPlan, *, redis: Redis, report: ScanReport
) -> list[queries.EventRow]:
    assessment = plan.assessment
    outcome = GroupOutcome(
        assessment.stream,
        assessment.group,
        assessment.target.consumer if assessment.target else None,
        no_target=len(plan.no_target),
    )
    report.per_group.append(outcome)
    rows: list[queries.EventRow] = []
    if plan.no_target:
        _log_no_target(plan)
    if report.dry_run:
        _log_dry_run(plan)
        outcome.reclaimed, outcome.dead_lettered = len(plan.moves), len(plan.dead_letters)
    else:
        if plan.dead_letters:
            rows += await _dead_letter(plan, redis=redis, outcome=outcome)
        if plan.moves:
            rows += await _move(plan, redis=redis, outcome=outcome)
    report.reclaimed += outcome.reclaimed
    report.dead_lettered += outcome.dead_lettered
    report.no_target += outcome.no_target
    report.skipped += outcome.skipped
    return rows


async def _move(
    plan: reclaim.ReclaimPlan, *, redis: Redis, outcome: GroupOutcome
) -> list[queries.EventRow]:
    assessment = plan.assessment
    target = assessment.target
    assert target is not None  # plan_reclaims only plans moves when there is a target
    stream, group = assessment.stream, assessment.group
    claimed = set(
        await redis_streams.claim(
            redis, stream=stream, group=group, target=target.consumer, entries=plan.moves
        )
    )
    moved = [entry for entry in plan.moves if entry.id in claimed]
    outcome.reclaimed = len(moved)
    outcome.skipped += len(plan.moves) - len(moved)
    if len(moved) < len(plan.moves):
        logger.info(
            "[StreamReclaim] Left %d entries on %s/%s: acked, re-read, trimmed or claimed "
            "elsewhere since the scan looked",
            len(plan.moves) - len(moved),
            stream,
            group,
        )
    if logger.isEnabledFor(logging.INFO):
        for entry in moved:
            logger.info(
                "[StreamReclaim] Reclaimed %s on %s: %s -> %s",
                entry.id,
                stream,
                entry.consumer,
                target.consumer,
                extra={
                    "entryId": entry.id,
                    "stream": stream,
                    "group": group,
                    "fromConsumer": entry.consumer,
                    "toConsumer": target.consumer,
                    "fromAgent": assessment.down[entry.consumer].agent,
                    "toAgent": target.agent,
                },
            )
    # One JSON prefix per owner: building a dict per entry would dominate a million-entry scan.
    prefixes = {
        consumer: _json_prefix(
            toConsumer=target.consumer,
            toAgent=target.agent,
            reasons=[r.value for r in verdict.reasons],
            lastHeartbeatAt=verdict.last_heartbeat_at.isoformat()
            if verdict.last_heartbeat_at
            else None,
        )
        for consumer, verdict in assessment.down.items()
    }
    down = assessment.down
    return [
        queries.EventRow(
            "RECLAIMED",
            agent_id=down[e.consumer].agent,
            consumer=e.consumer,
            stream=stream,
            group_name=group,
            entry_id=e.id,
            detail=f'{prefixes[e.consumer]}"idleMs":{e.idle_ms},"deliveries":{e.deliveries}}}',
        )
        for e in moved
    ]


async def _dead_letter(
    plan: reclaim.ReclaimPlan, *, redis: Redis, outcome: GroupOutcome
) -> list[queries.EventRow]:
    assessment = plan.assessment
    stream, group = assessment.stream, assessment.group
    done = await redis_streams.dead_letter(
        redis, stream=stream, group=group, entries=plan.dead_letters, reason=DEAD_LETTER_REASON
    )
    outcome.dead_lettered = len(done)
    outcome.skipped += len(plan.dead_letters) - len(done)
    owners = {entry.id: entry.consumer for entry in plan.dead_letters}
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
        rows.append(
            queries.EventRow(
                "DEAD_LETTERED",
                agent_id=assessment.down[consumer].agent,
                consumer=consumer,
                stream=stream,
                group_name=group,
                entry_id=item.entry_id,
                issue_id=item.issue_id,
                detail=json.dumps(
                    {
                        "deliveries": item.deliveries,
                        "reason": DEAD_LETTER_REASON,
                        "dlqStream": redis_streams.dlq_key(stream),
                        "dlqId": item.dlq_id,
                    }
                ),
            )
        )
    return rows


async def _record(
    plan: reclaim.ReclaimPlan, rows: list[queries.EventRow], *, engine: AsyncEngine, tenant: str
) -> None:
    """The event log, and the assignment rows: moved entries get a new attempt (fencing the old
    owner off), dead letters are marked dead."""
    await queries.append_events(engine, tenant=tenant, rows=rows)
    stream, target = plan.assessment.stream, plan.assessment.target
    moved = [row.entry_id for row in rows if row.kind == "RECLAIMED" and row.entry_id]
    if moved and target is not None:
        await work.reclaimed(
            engine, tenant=tenant, stream=stream, consumer=target.consumer, entry_ids=moved
        )
    dead = [
        (row.entry_id, row.issue_id, json.loads(row.detail)["deliveries"])
        for row in rows
        if row.kind == "DEAD_LETTERED" and row.entry_id
    ]
    await work.dead_lettered(engine, tenant=tenant, stream=stream, entries=dead)


def _count(
    plan: reclaim.ReclaimPlan, rows: list[queries.EventRow], outcome: GroupOutcome, metrics: Metrics
) -> None:
    stream, group = plan.assessment.stream, plan.assessment.group
    target = plan.assessment.target
    to_agent = (target.agent if target else None) or UNKNOWN_AGENT
    moved: dict[str, int] = {}
    for row in rows:
        if row.kind == "RECLAIMED":
            from_agent = row.agent_id or UNKNOWN_AGENT
            moved[from_agent] = moved.get(from_agent, 0) + 1
    for from_agent, count in moved.items():
        metrics.reclaimed.labels(stream, group, from_agent, to_agent).inc(count)
    if outcome.dead_lettered:
        metrics.dead_lettered.labels(stream, group).inc(outcome.dead_lettered)
    if outcome.no_target:
        metrics.no_target.labels(stream, group).inc(outcome.no_target)


def _log_no_target(plan: reclaim.ReclaimPlan) -> None:
    assessment = plan.assessment
    held: dict[ConsumerName, int] = {}
    for entry in plan.no_target:
        held[entry.consumer] = held.get(entry.consumer, 0) + 1
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
            },
        )


def _log_dry_run(plan: reclaim.ReclaimPlan) -> None:
    assessment = plan.assessment
    stream = assessment.stream
    for entry in plan.dead_letters:
        logger.info(
            "[StreamReclaim] DRY RUN: would dead-letter %s on %s after %d deliveries",
            entry.id,
            stream,
            entry.deliveries,
        )
    if assessment.target is None or not logger.isEnabledFor(logging.INFO):
        return
    for entry in plan.moves:
        logger.info(
            "[StreamReclaim] DRY RUN: would reclaim %s on %s: %s -> %s",
            entry.id,
            stream,
            entry.consumer,
            assessment.target.consumer,
        )


def _json_prefix(**fields: Any) -> str:
    """`{"a":1,` for fields a=1: the start of a JSON object that the caller closes."""
    return json.dumps(fields, separators=(",", ":"))[:-1] + ","


def describe_failure(exc: BaseException) -> str:
    """One line for a failed scan that says which dependency failed."""
    if isinstance(exc, RedisError):
        return f"Redis unavailable or refused a command: {type(exc).__name__}: {exc}"
    if isinstance(exc, SQLAlchemyError | OSError):
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"PostgreSQL unavailable: {type(exc).__name__}: {detail}"
    return f"{type(exc).__name__}: {exc}"
