"""One reaper scan: fetch -> plan -> apply -> report.

The decisions are `policy.reclaim`'s: which owners the scan acts on and why (down, degraded,
stalled), their entry rules and the spread over the targets. This module moves data between the
adapters and the policy, has `moves.sweep_group` apply the rules where the pending lists live,
writes the `[StreamReclaim]` log lines and records what it did in the event log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters import redis_streams, redis_sweep
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.domain import ConsumerName, GroupInfo, PendingEntry, PodState
from rig_conductor.metrics import UNKNOWN_AGENT, Metrics
from rig_conductor.policy import liveness, reclaim
from rig_conductor.reaper import cleanup, moves, observe
from rig_conductor.reaper.report import GroupOutcome, ScanReport
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

DEAD_LETTER_REASON = "max-deliveries"

# Looks up consumers by pod name: their states, for those Kubernetes could answer for.
Probe = Callable[[list[ConsumerName]], Awaitable[Mapping[ConsumerName, PodState]]]

__all__ = ["GroupOutcome", "ScanReport", "describe_failure", "reap_once"]


async def reap_once(
    *,
    redis: Redis,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool | None = None,
    pods: Mapping[ConsumerName, PodState] | None = None,
    metrics: Metrics | None = None,
    detector: observe.Detector | None = None,
    probe: Probe | None = None,
    hygiene: bool = False,
) -> ScanReport:
    """Scan every group of every configured stream once. Raises on Redis or Postgres failure.

    With `metrics`, counters and gauges are updated (not in a dry run: nothing moved); with
    `detector`, new sightings of consumers without heartbeat are logged and recorded; with
    `probe`, consumers holding entries that `pods` says nothing about are looked up by name;
    with `hygiene`, consumers whose pod is gone and that hold nothing are deleted.

    Redis's groups and consumers are read once (one XINFO pass) and the heartbeats once: the
    moves, the dead letters, the gauges, the detector and the clean-up all work from that
    reading, the counts corrected by what the scan itself moved.
    """
    started = time.perf_counter()
    limits = settings.limits
    report = ScanReport(dry_run=settings.dry_run if dry_run is None else dry_run)
    # Fetch.
    streams = await redis_streams.resolve_streams(redis, names=settings.streams)
    groups = await redis_streams.describe_groups(redis, streams=streams)
    if probe is not None:
        pods = {**(pods or {}), **await probe(_unexplained(groups, pods or {}))}
    evidence = await queries.load_evidence(
        engine, tenant=settings.tenant, configured_agents=settings.agent_ids, pods=pods
    )
    work_evidence = await work.load_work_evidence(
        engine,
        tenant=settings.tenant,
        streams=streams,
        worn_at=limits.max_deliveries,
        deadline_ms=limits.entry_deadline_ms,
    )
    fleet = liveness.Fleet(evidence, limits)
    report.streams = len(streams)
    for group in groups:
        report.groups += 1
        report.pending += group.pending
        # Plan.
        assessment = reclaim.assess_group(
            group,
            fleet,
            attempts=work_evidence.worn.get(group.stream),
            progress=work_evidence.progress.get(group.stream),
        )
        report.consumers_down += len(assessment.down)
        report.consumers_degraded += sum(
            r.reason == "degraded" for r in assessment.rules.values()
        ) + len(assessment.held)
        if not (assessment.rules or assessment.held):
            continue
        # Apply.
        outcome = await _apply(
            assessment,
            redis=redis,
            engine=engine,
            tenant=settings.tenant,
            dry_run=report.dry_run,
            metrics=metrics,
        )
        if outcome.reclaimed or outcome.dead_lettered or outcome.no_target or outcome.degraded_held:
            report.add(outcome)
    # Report.
    if not report.dry_run:
        # Gauges, the detector and the clean-up describe what is left after the moves.
        groups = _after_moves(groups, report.per_group)
    if hygiene and pods and not report.dry_run:
        await cleanup.remove_consumers(redis=redis, groups=groups, evidence=evidence, limits=limits)
    report.without_heartbeat = await observe.observe(
        groups=groups,
        fleet=fleet,
        engine=engine,
        tenant=settings.tenant,
        metrics=metrics,
        watch=detector,
    )
    report.duration_ms = round((time.perf_counter() - started) * 1000)
    return report


def _after_moves(groups: list[GroupInfo], outcomes: list[GroupOutcome]) -> list[GroupInfo]:
    """The groups as the scan left them: pending counts moved from owners to targets, dead
    letters gone. The oldest entry stays as read (a move makes it younger only)."""
    changes = {(o.stream, o.group): o for o in outcomes if o.changes}
    after: list[GroupInfo] = []
    for group in groups:
        outcome = changes.get((group.stream, group.name))
        if outcome is None:
            after.append(group)
            continue
        consumers = tuple(
            replace(c, pending=max(0, c.pending + outcome.changes.get(c.name, 0)))
            for c in group.consumers
        )
        pending = max(0, group.pending - outcome.dead_lettered)
        after.append(replace(group, pending=pending, consumers=consumers))
    return after


def _unexplained(
    groups: list[GroupInfo], pods: Mapping[ConsumerName, PodState]
) -> list[ConsumerName]:
    """Consumers holding entries whose pod the pod evidence says nothing about."""
    found = {c.name for g in groups for c in g.consumers if c.pending and c.name not in pods}
    return sorted(found)


async def _apply(
    assessment: reclaim.GroupAssessment,
    *,
    redis: Redis,
    engine: AsyncEngine,
    tenant: str,
    dry_run: bool,
    metrics: Metrics | None,
) -> GroupOutcome:
    swept = await moves.sweep_group(redis, assessment, dry_run=dry_run)
    outcome = _outcome(assessment, swept)
    _log_held(assessment)
    _log_no_target(assessment, swept.no_target)
    if dry_run:
        outcome.dead_lettered = len(swept.worn)
        _log_dry_run(assessment, swept)
        return outcome
    rows: list[queries.EventRow] = []
    dead: list[redis_streams.DeadLettered] = []
    if swept.worn:
        dead = await _dead_letter(assessment, swept.worn, redis=redis)
        outcome.dead_lettered = len(dead)
        owners = {entry.id: entry.consumer for entry in swept.worn}
        for item in dead:
            outcome.changes[owners[item.entry_id]] -= 1
        outcome.skipped += len(swept.worn) - len(dead)
        rows += _dead_letter_rows(assessment, swept.worn, dead)
    if swept.skipped:
        logger.info(
            "[StreamReclaim] Left %d entries on %s/%s: trimmed from the stream or touched since "
            "the scan looked",
            swept.skipped,
            assessment.stream,
            assessment.group,
        )
    _log_moves(assessment, swept)
    rows += _reclaim_rows(assessment, swept)
    await _record(assessment, swept, dead, rows, engine=engine, tenant=tenant)
    if metrics is not None:
        _count(assessment, swept, outcome, metrics)
    return outcome


def _count(
    assessment: reclaim.GroupAssessment,
    swept: moves.GroupSweep,
    outcome: GroupOutcome,
    metrics: Metrics,
) -> None:
    stream, group = assessment.stream, assessment.group
    agents = {t.consumer: t.agent for t in assessment.targets}
    for (owner, target), ids in swept.moved.items():
        rule = assessment.rules[owner]
        metrics.reclaimed.labels(
            stream,
            group,
            rule.agent or UNKNOWN_AGENT,
            agents.get(target) or UNKNOWN_AGENT,
            rule.reason,
        ).inc(len(ids))
    if outcome.dead_lettered:
        metrics.dead_lettered.labels(stream, group).inc(outcome.dead_lettered)
    if outcome.no_target:
        metrics.no_target.labels(stream, group).inc(outcome.no_target)


def _outcome(assessment: reclaim.GroupAssessment, swept: moves.GroupSweep) -> GroupOutcome:
    outcome = GroupOutcome(assessment.stream, assessment.group)
    for (owner, target), ids in swept.moved.items():
        outcome.targets[target] = outcome.targets.get(target, 0) + len(ids)
        outcome.by_reason[assessment.rules[owner].reason] += len(ids)
        outcome.changes[owner] -= len(ids)
        outcome.changes[target] += len(ids)
    outcome.reclaimed = swept.reclaimed
    outcome.no_target = sum(swept.no_target.values())
    outcome.degraded_held = sum(assessment.held.values())
    outcome.skipped = swept.skipped
    return outcome


def _log_moves(assessment: reclaim.GroupAssessment, swept: moves.GroupSweep) -> None:
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


def _reclaim_rows(
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


async def _dead_letter(
    assessment: reclaim.GroupAssessment, worn: list[PendingEntry], *, redis: Redis
) -> list[redis_streams.DeadLettered]:
    stream, group = assessment.stream, assessment.group
    done = await redis_streams.dead_letter(
        redis, stream=stream, group=group, entries=worn, reason=DEAD_LETTER_REASON
    )
    owners = {entry.id: entry.consumer for entry in worn}
    for item in done:
        logger.info(
            "[StreamReclaim] Dead-lettered %s on %s after %d deliveries",
            item.entry_id,
            stream,
            item.deliveries,
            extra={
                "entryId": item.entry_id,
                "stream": stream,
                "group": group,
                "consumer": owners[item.entry_id],
                "deliveries": item.deliveries,
                "dlqId": item.dlq_id,
            },
        )
    return done


def _dead_letter_rows(
    assessment: reclaim.GroupAssessment,
    worn: list[PendingEntry],
    done: list[redis_streams.DeadLettered],
) -> list[queries.EventRow]:
    owners = {entry.id: entry.consumer for entry in worn}
    rows: list[queries.EventRow] = []
    for item in done:
        consumer = owners[item.entry_id]
        detail = {
            "deliveries": item.deliveries,
            "reason": DEAD_LETTER_REASON,
            "dlqStream": redis_streams.dlq_key(assessment.stream),
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


async def _record(
    assessment: reclaim.GroupAssessment,
    swept: moves.GroupSweep,
    dead: list[redis_streams.DeadLettered],
    rows: list[queries.EventRow],
    *,
    engine: AsyncEngine,
    tenant: str,
) -> None:
    """The event log, and the assignment rows: moved entries get a new attempt (fencing the old
    owner off), dead letters are marked dead."""
    await queries.append_events(engine, tenant=tenant, rows=rows)
    by_target: dict[ConsumerName, list[str]] = {}
    for (_, target), ids in swept.moved.items():
        by_target.setdefault(target, []).extend(ids)
    for target, moved in by_target.items():
        await work.reclaimed(
            engine, tenant=tenant, stream=assessment.stream, consumer=target, entry_ids=moved
        )
    entries = [(d.entry_id, d.issue_id, d.deliveries) for d in dead]
    await work.dead_lettered(engine, tenant=tenant, stream=assessment.stream, entries=entries)


def _log_held(assessment: reclaim.GroupAssessment) -> None:
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


def _log_no_target(assessment: reclaim.GroupAssessment, held: Mapping[ConsumerName, int]) -> None:
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


def _log_dry_run(assessment: reclaim.GroupAssessment, swept: moves.GroupSweep) -> None:
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


def describe_failure(exc: BaseException) -> str:
    """One line for a failed scan that says which dependency failed."""
    if isinstance(exc, RedisError):
        return f"Redis unavailable or refused a command: {type(exc).__name__}: {exc}"
    if isinstance(exc, SQLAlchemyError | OSError):
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"PostgreSQL unavailable: {type(exc).__name__}: {detail}"
    return f"{type(exc).__name__}: {exc}"
