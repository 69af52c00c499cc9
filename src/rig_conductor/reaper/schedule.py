"""The reaper inside `serve`: APScheduler runs one scan every RIG_SCAN_INTERVAL_S after
RIG_STARTUP_DELAY_S, never two that change things at once, and the event-log retention once a
day. Every replica, leading or not, drops on that schedule the metric series of agents it no
longer hears from (RIG_AGENT_FORGET_MS).

With several replicas only the elected one reaps (a Kubernetes Lease, else a PostgreSQL
lease row); the others skip their scheduled scans. With Kubernetes on, each scan lists the
agents' pods for evidence, a deleted pod triggers a scan at once (`on_pod_gone`), and consumers
whose pods are gone and that hold nothing are deleted after the scan.

Scans asked for through the API, the console and the views coalesce (`coalesce`): requests
that arrive together share one scan and its report. Scans that may change things (scheduled,
after a pod went, asked for without a dry run) run one at a time under one lock; asked-for dry
runs run one at a time in a lane of their own beside them, so no flood of dry runs holds back
a reclaim.

A failing scan is logged and counted; the schedule carries on. So is a scheduled scan on a
replica whose election cannot be decided (its backend, PostgreSQL or the Kubernetes API, is
down): it cannot know whether anybody reaps. Stopping waits for a scan in progress to finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import history, listening, move_targets, queries
from rig_conductor.adapters.postgres import pods as pods_seen
from rig_conductor.adapters.redis.client import Topology
from rig_conductor.domain import NotLeading, PodName, Pods
from rig_conductor.effects import port
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import coalesce, cycle, leader, observe
from rig_conductor.reaper.pods import PodEvidence
from rig_conductor.scan_report import ScanReport
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

RETENTION_FIRST_RUN = timedelta(minutes=5)


class ReaperService:
    def __init__(
        self,
        *,
        redis: Redis | Topology,
        engine: AsyncEngine,
        settings: Settings,
        metrics: Metrics | None = None,
        pods: PodEvidence | None = None,
        elector: leader.Elector | None = None,
    ) -> None:
        self._redis = redis
        self._engine = engine
        self._settings = settings
        self._metrics = metrics
        self._pods = pods
        self._elector = elector
        self._detector = observe.Detector()
        self._lock = asyncio.Lock()  # the scans that may change things: one at a time
        # Scans asked for through the API, the console and the views, coalesced per lane: a
        # change waits for the lock like a scheduled scan; a dry run changes nothing, so it
        # runs in its own lane beside them and never holds back a scheduled scan's reclaims.
        self._changes = coalesce.Lane(self._requested_change)
        self._dry_runs = coalesce.Lane(self._requested_dry_run)
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._jobs: set[asyncio.Task[None]] = set()
        self._stopping = False
        self.last_report: cycle.ScanReport | None = None
        self.failed_scans = 0

    def start(self) -> None:
        now = datetime.now(UTC)
        self._scheduler.add_job(
            self._scheduled_scan,
            "interval",
            seconds=self._settings.scan_interval_s,
            next_run_time=now + timedelta(seconds=self._settings.startup_delay_s),
            id="reaper-scan",
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
        self._scheduler.add_job(
            self._retention,
            "interval",
            hours=24,
            next_run_time=now + RETENTION_FIRST_RUN,
            id="event-retention",
            max_instances=1,
            coalesce=True,
        )
        self._scheduler.start()
        logger.info(
            "Reaper scheduled: first scan in %.1fs, then every %.1fs",
            self._settings.startup_delay_s,
            self._settings.scan_interval_s,
        )

    async def stop(self) -> None:
        # APScheduler's AsyncIOScheduler shuts down on the loop's next turn, not in this call:
        # until then its timer can still start a job. A job started from now on does nothing.
        self._stopping = True
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
            await asyncio.sleep(0)  # let the shutdown happen
        # A scheduled job in progress finishes first (the scheduler's shutdown cancels only the
        # job's wrapper, see _unless_stopping); so does a scan asked for through the API.
        await asyncio.gather(*self._jobs, return_exceptions=True)
        await self._changes.wait()
        await self._dry_runs.wait()
        async with self._lock:
            pass

    async def _unless_stopping(self, work: Coroutine[object, object, None]) -> None:
        """Run a scheduled job so that the scheduler's shutdown, which cancels the jobs it
        runs, does not cut it off half-way: moves already made are logged and recorded, and
        stop() waits for the rest."""
        if self._stopping:
            work.close()
            return
        job = asyncio.create_task(work)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            logger.debug("Stopping: the job in progress finishes first")

    @property
    def leading(self) -> bool:
        """Whether this replica is the one that reaps (always, without an elector)."""
        return self._elector is None or self._elector.is_leader

    async def scan(
        self,
        *,
        dry_run: bool | None = None,
        pods: Pods | None = None,
        remember: bool = True,
    ) -> cycle.ScanReport:
        """One scan now, after any scan already running that may change things. Raises what the
        scan raised.

        `pods`: pod evidence to use instead of listing the pods (the watch's, after a deletion).
        `remember`: keep the report among the last scans (not a measurement for the views).
        """
        async with self._lock:
            return await self._scan(dry_run=dry_run, pods=pods, remember=remember)

    async def _scan(
        self,
        *,
        dry_run: bool | None,
        pods: Pods | None,
        remember: bool,
    ) -> cycle.ScanReport:
        started = time.perf_counter()
        # Where a scan starts, whether it is dry is decided, once: it is handed its write port.
        dry = self._settings.dry_run if dry_run is None else dry_run
        effects = port.choose(
            dry,
            engine=self._engine,
            tenant=self._settings.tenant,
            metrics=self._metrics,
            remember_s=self._settings.event_retention_days * 86_400,
        )
        try:
            if pods is None and self._pods is not None:
                pods = await self._pods.listing()
            report = await cycle.reap_once(
                redis=self._redis,
                engine=self._engine,
                settings=self._settings,
                effects=effects,
                pods=pods,
                probe=self._pods.probe if self._pods is not None else None,
                # Consumer hygiene in real scans only: a dry scan leaves the consumers alone.
                hygiene=self._pods is not None and not dry,
                metrics=self._metrics,
                detector=self._detector,
            )
        except Exception:
            self._record("error", started)
            raise
        self._record("ok", started)
        if self._metrics is not None:
            self._metrics.blind_window.set(report.blind_ms / 1000)
        if remember:
            await self._remember(report, effects)
        self.last_report = report
        return report

    async def _remember(self, report: cycle.ScanReport, effects: port.Effects) -> None:
        """Keep the report for the console's last scans and plots (through the scan's port, a
        dry one too: it is what the scan saw); a failure costs only that."""
        try:
            await effects.reported(report.model_dump(mode="json", by_alias=True))
        except Exception as exc:
            logger.warning("Scan report not stored: %s", cycle.describe_failure(exc))

    async def scan_now(self, dry_run: bool | None) -> ScanReport:
        """A scan asked for through the API or the console, and its report: of a scan that
        started after the request arrived, shared with the requests that arrived with it
        (`coalesce`). A change on a replica that is not the active reaper raises NotLeading:
        two replicas never both act. Without `dry_run`, RIG_DRY_RUN decides."""
        if self._settings.dry_run if dry_run is None else dry_run:
            return await self._dry_runs.ask()
        if not self.leading:
            raise NotLeading("this replica is not the active reaper")
        return await self._changes.ask()

    async def measure(self) -> None:
        """A dry-run scan for the views, when no scan has measured the fleet lately
        (`operations.measured`): its report is not kept among the last scans (unless a
        requester it was shared with asked for that)."""
        await self._dry_runs.ask(remember=False)

    async def _requested_change(self, remember: bool) -> ScanReport:
        return await self.scan(dry_run=False, remember=remember)

    async def _requested_dry_run(self, remember: bool) -> ScanReport:
        # Not under the lock: it changes nothing in Redis, and its lane runs one at a time.
        return await self._scan(dry_run=True, pods=None, remember=remember)

    async def on_pod_gone(self, pod: PodName) -> None:
        """The watch saw a consumer's pod deleted or finished: reclaim now, not next scan."""
        if not self.leading or self._pods is None:
            return
        logger.info("Pod %s is gone: scanning now", pod)
        try:
            await self.scan(pods=self._pods.known())
        except Exception as exc:
            self.failed_scans += 1
            logger.error("Scan after pod %s went failed: %s", pod, cycle.describe_failure(exc))

    def _record(self, outcome: str, started: float) -> None:
        if self._metrics is not None:
            self._metrics.scans.labels(outcome).inc()
            self._metrics.scan_duration.observe(time.perf_counter() - started)

    async def _scheduled_scan(self) -> None:
        await self._unless_stopping(self._scan_on_schedule())

    async def _scan_on_schedule(self) -> None:
        self._forget_series()
        if not self.leading:
            trouble = self._elector.trouble if self._elector is not None else None
            if trouble is None:
                logger.debug("Not the active reaper: scheduled scan skipped")
                return
            # Nobody here can tell who reaps (PostgreSQL or the Kubernetes API is down): that
            # is a scan that did not happen, and must show as one.
            self.failed_scans += 1
            if self._metrics is not None:  # counted, but no duration: nothing ran
                self._metrics.scans.labels("error").inc()
            logger.error("Scan failed: no active reaper can be elected: %s", trouble)
            return
        try:
            report = await self.scan()
        except Exception as exc:
            self.failed_scans += 1
            logger.error("Scan failed: %s", cycle.describe_failure(exc))
            return
        if report.reclaimed or report.dead_lettered or report.no_target:
            logger.info(
                "Scan: %d reclaimed, %d dead-lettered, %d without target in %d ms",
                report.reclaimed,
                report.dead_lettered,
                report.no_target,
                report.duration_ms,
            )

    def _forget_series(self) -> None:
        """Drop the metric series of agents silent past RIG_AGENT_FORGET_MS: on every replica,
        since each exports the series of the heartbeats it took in. (Only the active reaper
        deletes their rows: `cycle.reap_once`.)"""
        if self._metrics is None:
            return
        cutoff = time.time() - self._settings.agent_forget_ms / 1000
        keep = {*self._settings.known_agents}
        gone = self._metrics.forget_silent(before=cutoff, keep=keep)
        if gone:
            logger.info("Metrics: dropped the series of %d agents no longer heard from", len(gone))

    async def _retention(self) -> None:
        await self._unless_stopping(self._retain())

    async def _retain(self) -> None:
        if not self.leading:
            return
        try:
            days = self._settings.event_retention_days
            deleted = await queries.delete_old_events(self._engine, older_than_days=days)
            await pods_seen.forget_older_than(self._engine, days=days)
            await queries.delete_old_intervals(self._engine, older_than_days=days)
            await listening.forget_older_than(self._engine, days=days)
            await move_targets.forget_older_than(self._engine, days=1)
            await history.forget_scans(self._engine, older_than_days=days)
        except Exception as exc:
            logger.error("Event retention failed: %s", cycle.describe_failure(exc))
            return
        if deleted:
            logger.info(
                "Event retention: deleted %d events older than %d days",
                deleted,
                self._settings.event_retention_days,
            )
