"""The views that read what the last scan measured (`policy.measure`, stored by every scan):
the streams and groups, and the overview. They cost the same at a million consumers as at ten,
and each figure says when it was measured.

A view finds the figures fresh: the active reaper scans every RIG_SCAN_INTERVAL_S. When no scan
has measured the fleet for twice that (a fresh start, or nothing scans here), the view runs a
dry-run scan first (not listed among the last scans), one at a time, so viewers polling share
it and never re-read Redis more often than the reaper would.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from rig_conductor.adapters.postgres import history, measurements
from rig_conductor.adapters.postgres.measurements import Measured, Totals
from rig_conductor.domain import FleetMeasure
from rig_conductor.runtime import Runtime

logger = logging.getLogger(__name__)

STREAMS_PAGE = 100  # streams per page of GET /api/streams unless asked otherwise
ATTENTION_ROWS = 50  # the overview's groups: the most consumers down, then the most pending
STALE_FLOOR_S = 10.0
WORK_WINDOW_S, WORK_BUCKET_S = 3600, 300  # the overview's work plot: the last hour, by 5 minutes


@dataclass(frozen=True, slots=True)
class WorkSeries:
    """The last hour by 5-minute buckets (each bucket's start, epoch seconds): the completions
    accepted in it (throughput), and the lag of every group summed (entries no consumer of its
    group has read yet) as the bucket's last scan measured it (None: no scan measured it)."""

    t: list[int]
    finished: list[int]
    lag: list[int | None]


def work_series(
    finished: dict[int, int], scans: list[history.ScanRow], now: datetime
) -> WorkSeries:
    newest = int(now.timestamp()) // WORK_BUCKET_S * WORK_BUCKET_S
    starts = [newest - WORK_BUCKET_S * n for n in range(WORK_WINDOW_S // WORK_BUCKET_S - 1, -1, -1)]
    lag: dict[int, int] = {}
    for scan in reversed(scans):  # oldest first: the bucket keeps its last scan's figure
        measured = scan.report.get("lag")
        if not scan.dry_run and isinstance(measured, int):
            lag[int(scan.finished_at.timestamp()) // WORK_BUCKET_S * WORK_BUCKET_S] = measured
    return WorkSeries(starts, [finished.get(t, 0) for t in starts], [lag.get(t) for t in starts])


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    totals: Totals
    groups: list[Measured]  # the ATTENTION_ROWS needing attention most
    agents: FleetMeasure
    scans: list[history.ScanRow]
    nodes_failed: list[str]  # Redis nodes the last scan could not read
    work: WorkSeries

    @property
    def as_of(self) -> datetime | None:
        """When the stalest figure shown was measured."""
        return self.totals.oldest_measured_at

    @property
    def dead_letters(self) -> int:
        """Dead letters of the streams shown (each stream once)."""
        return sum({m.group.stream: m.group.dead_letters for m in self.groups}.values())


async def fresh(rt: Runtime) -> tuple[datetime, datetime]:
    """PostgreSQL's now, and the time of the measurements the views read, after measuring anew
    if they are stale. Fresh figures cost one query; the lock is taken only to measure."""
    stale_after_s = max(2 * rt.settings.scan_interval_s, STALE_FLOOR_S)

    async def latest() -> tuple[datetime, datetime | None]:
        now, measured_at = await measurements.latest(rt.engine, tenant=rt.settings.tenant)
        if measured_at is not None and (now - measured_at).total_seconds() <= stale_after_s:
            return now, measured_at
        return now, None

    now, measured_at = await latest()
    if measured_at is not None:
        return now, measured_at
    async with rt.measuring:
        now, measured_at = await latest()  # a view that held the lock may have measured
        if measured_at is not None:
            return now, measured_at
        logger.info(
            "No scan measured the fleet in the last %.0f s: a dry-run scan for the views",
            stale_after_s,
        )
        await rt.measure()
        now, measured_at = await measurements.latest(rt.engine, tenant=rt.settings.tenant)
    return now, measured_at or now


async def streams(rt: Runtime, *, after: str | None, limit: int = STREAMS_PAGE) -> list[Measured]:
    """The groups of a page of `limit` streams after `after`, by stream and group name."""
    await fresh(rt)
    return await measurements.streams_page(
        rt.engine, tenant=rt.settings.tenant, after=after, limit=limit
    )


async def streams_json(
    rt: Runtime, *, after: str | None, limit: int = STREAMS_PAGE
) -> measurements.StreamsPage:
    """`streams` as the API sends it: the JSON built by PostgreSQL."""
    await fresh(rt)
    return await measurements.streams_page_json(
        rt.engine, tenant=rt.settings.tenant, after=after, limit=limit
    )


async def overview(rt: Runtime, *, scans: int = 60) -> Overview:
    now, _ = await fresh(rt)
    tenant = rt.settings.tenant
    fleet = await measurements.fleet(rt.engine, tenant=tenant)
    recent = await history.recent_scans(rt.engine, tenant=tenant, limit=scans)
    failed = recent[0].report.get("nodesFailed") or [] if recent else []
    totals = await measurements.totals(rt.engine, tenant=tenant)
    finished = await history.finished_per_bucket(
        rt.engine, tenant=tenant, window_s=WORK_WINDOW_S, bucket_s=WORK_BUCKET_S
    )
    return Overview(
        now=now,
        totals=totals,
        groups=await measurements.needing_attention(rt.engine, tenant=tenant, limit=ATTENTION_ROWS),
        agents=fleet[0] if fleet is not None else FleetMeasure(0, 0, 0),
        scans=recent,
        nodes_failed=[str(node) for node in failed],
        work=work_series(finished, recent, now),
    )
