"""One reaper scan: fetch -> plan -> apply -> report.

The decisions are `policy.reclaim`'s: which owners the scan acts on and why (down, degraded,
stalled), their entry rules and the spread over the targets. This module moves data between the
adapters and the policy and has `moves.sweep_group` plan where the pending lists live; the
effects (the moves, the dead letters, the `[StreamReclaim]` lines, the event log, the counters)
are the write port's (`effects.port`): the scan is handed one, `DryEffects` in a dry run, and
hands every write to it, the applier of each group's plans (`effects.applier`) among them.
Nothing here asks whether the scan is dry.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence, Set
from dataclasses import replace
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis import inspection as redis_inspect
from rig_conductor.adapters.redis import reading
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import Topology
from rig_conductor.domain import (
    ConsumerName,
    Evidence,
    GroupInfo,
    Heartbeat,
    Limits,
    Pods,
    PodState,
    StreamKey,
)
from rig_conductor.effects.port import Effects
from rig_conductor.operations import evidence as built
from rig_conductor.policy import liveness, measure, reclaim, registry
from rig_conductor.reaper import cleanup, moves, observe, redis_loss, redispatch
from rig_conductor.scan_report import GroupOutcome, ScanReport
from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

logger = logging.getLogger(logs.RECLAIM_LOGGER)  # the name the reclaim lines share


# Looks up consumers by pod name: their states, for those Kubernetes could answer for.
Probe = Callable[[list[ConsumerName]], Awaitable[Mapping[ConsumerName, PodState]]]

__all__ = ["GroupOutcome", "ScanReport", "describe_failure", "reap_once"]


async def reap_once(
    *,
    redis: Redis | Topology,
    engine: AsyncEngine,
    settings: Settings,
    effects: Effects,
    pods: Pods | None = None,
    metrics: Metrics | None = None,
    detector: observe.Detector | None = None,
    probe: Probe | None = None,
    hygiene: bool = False,
) -> ScanReport:
    """Scan every group of every configured stream once. Raises on Redis or Postgres failure
    (on a cluster, a failing node is left out and counted instead: `reading.read`).

    `redis` is one server's client, or the `Topology` of a cluster (or of one server). Every
    write goes through `effects`, chosen where the scan was asked for (`effects.choose`). With
    `metrics`, gauges are updated (the port counts what it did: nothing, in a dry run); with
    `detector`, new sightings of consumers without heartbeat are logged and recorded; with
    `probe`, consumers holding entries that `pods` says nothing about are looked up by name
    (with `pods` from a successful list, a pod they do not name is missing); with `hygiene`,
    consumers whose pod is gone and that hold nothing are deleted (the entry point asks for it
    in real scans only: a dry scan has always left the consumers alone, and silently).
    """
    started = time.perf_counter()
    report = ScanReport(dry_run=effects.dry)
    topology = redis if isinstance(redis, Topology) else Topology(redis)
    with report.timing("redispatch"):
        await _redispatch(report, topology, engine=engine, settings=settings, effects=effects)
    # Fetch.
    with report.timing("read"):
        read_at = await queries.clock(engine)
        # Quiet consumers only counted, but with consumer hygiene (which may remove them).
        others = None if hygiene else measure.TOP_CONSUMERS
        world = await reading.read(topology, settings.streams, others=others)
    if probe is not None:
        with report.timing("pods"):
            pods = pods or Pods()
            pods = pods.adding(await probe(_unexplained(world.groups, pods.states)))
    # Consumer hygiene acts on what Kubernetes answered: nothing after a failed list.
    tidy = hygiene and pods is not None and bool(pods.states)
    # The consumers' own heartbeats of the consumers holding entries only: every other one is
    # looked up only in a group where something moves (`_Scan.node`). With consumer hygiene on
    # (Kubernetes), every one: a consumer that holds nothing may be removed.
    holders = None if tidy else _holders(world.groups)
    with report.timing("evidence"):
        evidence = await built.load(engine, settings, pods=pods, consumers=holders, read_at=read_at)
        work_evidence = await _work_evidence(engine, settings, world.streams)
    scan = _Scan(
        report, evidence, work_evidence, topology, engine, settings, metrics, holders, effects
    )
    await scan.every_node(world)  # plan and apply
    await scan.after(world, detector=detector, hygiene=tidy)  # report
    report.duration_ms = round((time.perf_counter() - started) * 1000)
    if not isinstance(redis, Topology):
        await topology.aclose()
    return report


async def _work_evidence(
    engine: AsyncEngine, settings: Settings, streams: Sequence[StreamKey]
) -> work.WorkEvidence:
    """Recorded attempts and progress of the entries of `streams` (rules 4b, 7: docs/rules.md)."""
    limits = settings.limits
    return await work.load_work_evidence(
        engine,
        tenant=settings.tenant,
        streams=streams,
        worn_at=limits.max_deliveries,
        deadline_ms=limits.entry_deadline_ms,
        settle_ms=limits.agent_down_ms,  # an agent silent longer than this is down: rule 3 then
    )


async def _redispatch(
    report: ScanReport,
    topology: Topology,
    *,
    engine: AsyncEngine,
    settings: Settings,
    effects: Effects,
) -> None:
    """Put back the dispatches Redis lost. A loss of all of its data first: that appends every
    unfinished dispatch, so the per-scan check of recent ones then finds nothing missing."""
    recovery = await redis_loss.recover(
        topology,
        engine=engine,
        tenant=settings.tenant,
        dispatch_stream=settings.dispatch_stream,
        window_s=settings.event_retention_days * 86_400,
        effects=effects.recovering(),
    )
    report.redis_data_lost = recovery.lost
    report.redispatched = recovery.appended
    if recovery.lost and not recovery.fixed:
        return  # the check of recent ones would count the same dispatches again
    report.redispatched += await redispatch.redispatch_lost(
        topology, engine=engine, tenant=settings.tenant, effects=effects
    )


class _Scan:
    """The plan-and-apply step of one scan, run on each node's groups, and what follows it.

    The groups of the nodes are judged side by side on one evidence, which nothing changes: a
    group judged on more heartbeats is judged on a fleet of its own (`Fleet.adding`), and what
    follows the moves on the evidence with every heartbeat the groups read.
    """

    def __init__(
        self,
        report: ScanReport,
        evidence: Evidence,
        work_evidence: work.WorkEvidence,
        topology: Topology,
        engine: AsyncEngine,
        settings: Settings,
        metrics: Metrics | None,
        loaded: Set[ConsumerName] | None,
        effects: Effects,
    ) -> None:
        self.report = report
        self.evidence = evidence
        self.fleet = liveness.Fleet(evidence, settings.limits)
        report.blind_ms = self.fleet.blind_ms
        self.work_evidence = work_evidence
        self.topology = topology
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        # The consumers whose own heartbeats the evidence holds (None: every consumer's).
        self.loaded = loaded
        self.effects = effects

    async def every_node(self, world: reading.Reading) -> None:
        """Plan and apply on every node at once; a node that fails is left out on a cluster
        (`Reading.go_on_without`), and counted."""
        self.report.streams = len(world.streams)
        # The heartbeats the groups read besides the evidence's: gathered here, judged on by
        # no group (each is judged on its own), used once every node is done.
        read: dict[ConsumerName, Heartbeat] = {}
        outcomes = await asyncio.gather(
            *(self.node(node_reading, read) for node_reading in world.nodes),
            return_exceptions=True,
        )
        for node_reading, outcome in zip(world.nodes, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                world.go_on_without(self.topology, node_reading.node.name, outcome)
        # What follows the moves judges the consumers that received entries on the heartbeats
        # they were chosen on.
        self.fleet = self.fleet.adding(read)
        self.evidence = self.fleet.evidence
        self.report.nodes_failed = sorted(world.failed)
        if self.metrics is not None:
            for node in world.failed:
                self.metrics.node_errors.labels(node).inc()

    async def after(
        self, world: reading.Reading, *, detector: observe.Detector | None, hygiene: bool
    ) -> None:
        """What follows the moves: the clean-up, the registry, the gauges and the detector.

        Redis's groups and consumers were read once (one XINFO pass per node) and the
        heartbeats once: the moves, the dead letters and all of this work from that reading,
        the counts corrected by what the scan itself moved (none in a dry run).
        """
        report, groups, settings, effects = self.report, world.groups, self.settings, self.effects
        groups = _after_moves(groups, report.groups_detail)
        if hygiene:
            with report.timing("cleanup"):
                await _remove_consumers(world, groups, self.evidence, settings.limits, effects)
        with report.timing("forget"):
            await _forget(world, groups, self.fleet, settings=settings, effects=effects)
        with report.timing("observe"):
            report.consumers_without_heartbeat = await observe.observe(
                groups=groups,
                fleet=self.fleet,
                engine=self.engine,
                tenant=settings.tenant,
                metrics=self.metrics,
                watch=detector,
                effects=effects,
            )
        with report.timing("measure"):
            await _measure(world, groups, self.fleet, self.topology, effects)

    async def node(
        self, node_reading: reading.NodeReading, read: dict[ConsumerName, Heartbeat]
    ) -> None:
        """Plan and apply on one node's groups; the heartbeats its groups read go to `read`."""
        report = self.report
        for n, group in enumerate(node_reading.groups):
            report.groups += 1
            report.pending += group.pending
            if group.lag is not None:
                report.lag = (report.lag or 0) + group.lag
            # Plan.
            assessment = self._assess(group, self.fleet)
            if assessment.rules or assessment.left_degraded:
                # Something moves: every consumer, each judged on its own heartbeat, is ranked
                # as a target. The reading summed up the quiet ones: read the group in full.
                if not group.complete:
                    group = node_reading.groups[n] = await _in_full(node_reading, group)
                beats = await self._own_heartbeats(group)
                read.update(beats)
                assessment = self._assess(group, self.fleet.adding(beats))
            report.consumers_down += len(assessment.down)
            report.consumers_degraded += sum(
                r.reason == "degraded" for r in assessment.rules.values()
            ) + len(assessment.left_degraded)
            if not (assessment.rules or assessment.left_degraded):
                continue
            # Apply. A slot that moved since the scan read it moved nothing (every move is
            # guarded where the stream lives): one retry where it lives now.
            outcome = await redis_client.on_owner(
                self.topology,
                group.stream,
                functools.partial(self._apply, assessment),
                client=node_reading.node.client,
            )
            if (
                outcome.reclaimed
                or outcome.dead_lettered
                or outcome.no_target
                or outcome.degraded_held
            ):
                report.add(outcome)

    def _assess(self, group: GroupInfo, fleet: liveness.Fleet) -> reclaim.GroupAssessment:
        worn, progress, finished = self.work_evidence.of(group.stream, group.name)
        return reclaim.assess_group(
            group, fleet, attempts=worn, progress=progress, finished=finished
        )

    async def _own_heartbeats(self, group: GroupInfo) -> Mapping[ConsumerName, Heartbeat]:
        """The own heartbeats of the group's consumers that the evidence did not read (the
        targets of a group where something moves are judged on them, rule 5 of
        docs/rules.md). Read for this group alone: a consumer of two such groups is read twice
        rather than shared between groups judged side by side."""
        if self.loaded is None:
            return {}
        missing = [c.name for c in group.consumers if c.name not in self.loaded]
        if not missing:
            return {}
        return await queries.own_heartbeats(
            self.engine, tenant=self.settings.tenant, consumers=missing
        )

    async def _apply(self, assessment: reclaim.GroupAssessment, client: Redis) -> GroupOutcome:
        applier = self.effects.reclaim(assessment, redis=client, timing=self.report.timing)
        try:
            await moves.sweep_group(
                assessment,
                reader=moves.PageReader(client, self.report.timing),
                effects=applier,
            )
        finally:
            await applier.flush()  # what moved is in the event log, even when the sweep failed
        return await applier.finish()


async def _remove_consumers(
    world: reading.Reading,
    groups: list[GroupInfo],
    evidence: Evidence,
    limits: Limits,
    effects: Effects,
) -> None:
    """Consumer hygiene on each node that the scan read and acted on."""
    for node_reading in world.nodes:
        if node_reading.node.name in world.failed:
            continue
        mine = {(g.stream, g.name) for g in node_reading.groups}
        await cleanup.remove_consumers(
            redis=node_reading.node.client,
            groups=[g for g in groups if (g.stream, g.name) in mine],
            evidence=evidence,
            limits=limits,
            effects=effects,
        )


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


async def _in_full(node_reading: reading.NodeReading, group: GroupInfo) -> GroupInfo:
    """The group read again with every consumer (it may have changed: the new reading counts)."""
    client = node_reading.node.client
    found = await redis_streams.describe_groups(client, streams=[group.stream], only=group.name)
    return next((g for g in found if g.name == group.name), group)


def _holders(groups: list[GroupInfo]) -> set[ConsumerName]:
    return {c.name for g in groups for c in g.consumers if c.pending}


def _unexplained(
    groups: list[GroupInfo], pods: Mapping[ConsumerName, PodState]
) -> list[ConsumerName]:
    """Consumers holding entries whose pod the pod evidence says nothing about."""
    found = {c.name for g in groups for c in g.consumers if c.pending and c.name not in pods}
    return sorted(found)


async def _forget(
    world: reading.Reading,
    groups: list[GroupInfo],
    fleet: liveness.Fleet,
    *,
    settings: Settings,
    effects: Effects,
) -> None:
    """Drop the heartbeat rows of agents and consumers silent past RIG_AGENT_FORGET_MS, but for
    those `policy.registry` keeps. Their gauges go at the next refresh (`observe`). Not after a
    partial reading: the consumers of a node left out would not be kept (nor in a dry run:
    its port forgets nothing)."""
    if world.failed:
        return
    plan = registry.plan_forgetting(
        groups, fleet, forget_ms=settings.agent_forget_ms, configured=settings.known_agents
    )
    await effects.forget(plan, forget_ms=settings.agent_forget_ms)


async def _measure(
    world: reading.Reading,
    groups: list[GroupInfo],
    fleet: liveness.Fleet,
    topology: Topology,
    effects: Effects,
) -> None:
    """Store what the views show (`policy.measure`), in a dry run too (the port records what
    the scan saw in both): not a change. A failure to store costs the views their freshness,
    not the scan."""
    letters: dict[StreamKey, int] = {}
    for node_reading in world.nodes:
        if node_reading.node.name in world.failed:
            continue
        try:
            letters |= await redis_inspect.dead_letter_counts_on_node(
                node_reading.node.client,
                streams=node_reading.streams,
                clustered=topology.clustered,
            )
        except RedisError as exc:
            logger.warning("Dead letters not counted: %s", describe_failure(exc))
    try:
        await effects.measured(
            measure.measure_groups(groups, fleet, letters),
            measure.measure_fleet(fleet),
            complete=not world.failed,
        )
    except SQLAlchemyError as exc:
        logger.warning("Scan measurements not stored: %s", describe_failure(exc))


def describe_failure(exc: BaseException) -> str:
    """One line for a failed scan that says which dependency failed."""
    if isinstance(exc, RedisError):
        return f"Redis unavailable or refused a command: {type(exc).__name__}: {exc}"
    if isinstance(exc, SQLAlchemyError | OSError):
        detail = str(exc).splitlines()[0] if str(exc) else ""
        return f"PostgreSQL unavailable: {type(exc).__name__}: {detail}"
    return f"{type(exc).__name__}: {exc}"
