"""One audit run: read the window's events over JDBC and the pending lists from Redis, apply
`reconcile`'s rules, and hand the findings to `summary` to write."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rig_conductor.audit.sources import EventBounds, JdbcSource, RedisSnapshot
from rig_conductor.audit.session import AuditOptions, _ms_since
from rig_conductor.audit.summary import LATENCY_BINS, summarize, write_outputs

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# ------------------------------------------------------------------------------------------ run


@dataclass
class Loaded:
    """The window's events, read and cached, with what the read found."""

    events: DataFrame
    bounds: EventBounds
    rows: int
    partitions: int
    cached: list[DataFrame] = field(default_factory=list)

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


@dataclass
class Findings:
    """The reconciled frames; the intermediate ones `main` reuses are cached."""

    status: DataFrame
    lost: DataFrame
    duplicates: DataFrame
    overlaps: DataFrame
    reclaims: DataFrame
    latency: DataFrame
    histogram: DataFrame
    availability: DataFrame
    down_periods: DataFrame
    dead_letter_rate: DataFrame
    dead_letters: DataFrame
    pending_over_time: DataFrame
    sightings: DataFrame
    reports: DataFrame
    cached: list[DataFrame] = field(default_factory=list)

    def tables(self) -> dict[str, DataFrame]:
        """The Parquet tables written under the output directory, by name."""
        return {
            "entries": self.status,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "overlapping_attempts": self.overlaps,
            "reclaims": self.reclaims,
            "reclaim_latency_histogram": self.histogram,
            "availability": self.availability,
            "agent_down_periods": self.down_periods,
            "dead_letter_rate": self.dead_letter_rate,
            "dead_letters": self.dead_letters,
            "pending_over_time": self.pending_over_time,
            "detector_sightings": self.sightings,
        }

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


@contextmanager
def _timed(timings: dict[str, int], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0) + _ms_since(started)


def run(
    spark: SparkSession,
    *,
    settings: Settings,
    options: AuditOptions,
    source: JdbcSource,
    timings: dict[str, int] | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> dict[str, Any]:
    """One audit into `options.output`; returns the summary it wrote."""
    from rig_conductor.audit import sources

    timings = timings if timings is not None else {}
    evaluated_at = clock()
    window_end = min(options.until, evaluated_at) if options.until else evaluated_at
    logger.info(
        "Auditing tenant %s, events %s to %s, into %s",
        settings.tenant,
        options.since.isoformat() if options.since else "from the start",
        options.until.isoformat() if options.until else "now",
        options.output,
    )
    with _timed(timings, "readMs"):
        loaded = load_events(
            spark,
            source,
            tenant=settings.tenant,
            since=options.since,
            until=options.until,
            partitions=options.partitions,
        )
    findings: Findings | None = None
    try:
        with _timed(timings, "readMs"):
            streams = dispatched_streams(loaded.events)
        with _timed(timings, "redisMs"):
            client = sources.connect(settings)
            try:
                snapshot = sources.read_redis(client, streams=streams)
            finally:
                client.close()
        # On a live system an entry finished between the event read and the Redis read has left
        # its pending list, but its completion was logged after the read: take it from the tail.
        if options.until is None and loaded.bounds.high is not None:
            with _timed(timings, "readMs"):
                load_tail(spark, source, loaded, tenant=settings.tenant)
        with _timed(timings, "computeMs"):
            first = options.since or loaded.bounds.first_at or window_end
            findings = reconcile_all(
                spark,
                loaded.events,
                snapshot,
                window_end=window_end,
                down_ms=settings.agent_down_ms,
                span_ms=max((window_end - first).total_seconds() * 1000, 0.0),
            )
            summary, data = summarize(
                findings,
                settings=settings,
                options=options,
                loaded=loaded,
                snapshot=snapshot,
                window_end=window_end,
            )
        with _timed(timings, "writeMs"):
            write_outputs(findings, summary, data, options.output, timings=timings)
    finally:
        loaded.release()
        if findings is not None:
            findings.release()
    return summary


def load_events(
    spark: SparkSession,
    source: JdbcSource,
    *,
    tenant: str,
    since: datetime | None,
    until: datetime | None,
    partitions: int | None,
) -> Loaded:
    """Read the window's events with a partitioned JDBC read on `id`, cache and count them.

    The read stops at the highest id the bounds query saw, so every partition reads the same
    snapshot of a log that keeps growing.
    """
    from rig_conductor.audit import reconcile, sources

    where = sources.event_filter(tenant=tenant, since=since, until=until)
    bounds = sources.read_bounds(spark, source, where=where)
    parallelism = spark.sparkContext.defaultParallelism
    count = partitions or sources.partitions_for(bounds.rows, parallelism=parallelism)
    if bounds.rows == 0 or bounds.high is None:
        events = spark.createDataFrame([], reconcile.EVENTS_SCHEMA)
    else:
        events = sources.read_events(
            spark,
            source,
            where=sources.event_filter(
                tenant=tenant, since=since, until=until, up_to_id=bounds.high
            ),
            bounds=bounds,
            partitions=count,
        )
    events = events.persist()
    rows = events.count()
    logger.info(
        "Read %d events (ids %s to %s) in %d JDBC partitions", rows, bounds.low, bounds.high, count
    )
    return Loaded(events=events, bounds=bounds, rows=rows, partitions=count, cached=[events])


def load_tail(spark: SparkSession, source: JdbcSource, loaded: Loaded, *, tenant: str) -> None:
    """Completions and dead letters logged after the window's read, added to `loaded.events`."""
    from rig_conductor.audit import reconcile, sources

    assert loaded.bounds.high is not None
    tail = sources.read_events(
        spark,
        source,
        where=sources.event_filter(
            tenant=tenant,
            after_id=loaded.bounds.high,
            kinds=(reconcile.WORK_COMPLETED, reconcile.DEAD_LETTERED),
        ),
        bounds=None,
        partitions=1,
    ).persist()
    added = tail.count()
    loaded.cached.append(tail)
    if added:
        logger.info("Read %d completions and dead letters logged since", added)
        loaded.events = loaded.events.unionByName(tail)


def dispatched_streams(events: DataFrame) -> list[str]:
    from pyspark.sql import functions as F

    from rig_conductor.audit import reconcile

    rows = (
        events.where(
            F.col("kind").isin(reconcile.ISSUE_ASSIGNED, reconcile.DEAD_LETTER_REQUEUED)
            & F.col("stream").isNotNull()
        )
        .select("stream")
        .distinct()
        .collect()
    )
    return sorted(str(row["stream"]) for row in rows)


def reconcile_all(
    spark: SparkSession,
    events: DataFrame,
    snapshot: RedisSnapshot,
    *,
    window_end: datetime,
    down_ms: int,
    span_ms: float,
) -> Findings:
    """Apply every rule. Lazy: Spark computes when `summarize` and the writers ask."""
    from rig_conductor.audit import duplicates, timelines
    from rig_conductor.audit import reconcile as rc

    pending = spark.createDataFrame(snapshot.pending, rc.PENDING_SCHEMA, verifySchema=False)
    queue = spark.createDataFrame(snapshot.letters, rc.DEAD_LETTER_QUEUE_SCHEMA, verifySchema=False)
    cached: list[DataFrame] = []

    def keep(frame: DataFrame) -> DataFrame:
        cached.append(frame.persist())
        return frame

    dispatched = keep(rc.dispatched(events))
    reports = keep(rc.work_reports(events, dispatched))
    dead = keep(rc.dead_letters(events, queue))
    status = keep(
        rc.entry_status(dispatched, reports, dead, pending, rc.unmatched_requeues(events))
    )
    overlaps = keep(duplicates.overlapping_attempts(reports))
    reclaims = keep(timelines.reclaims(events))
    gaps = keep(timelines.heartbeat_gaps(events, window_end=window_end))
    return Findings(
        status=status,
        lost=rc.lost(status),
        duplicates=keep(duplicates.duplicates(reports, overlaps)),
        overlaps=overlaps,
        reclaims=reclaims,
        latency=timelines.reclaim_latency(reclaims),
        histogram=timelines.latency_histogram(reclaims, LATENCY_BINS),
        availability=keep(timelines.availability(gaps, down_ms=down_ms)),
        down_periods=timelines.down_periods(gaps, down_ms=down_ms),
        dead_letter_rate=rc.dead_letter_rate(status),
        dead_letters=dead,
        pending_over_time=timelines.pending_over_time(
            status, bucket_ms=timelines.choose_bucket_ms(span_ms)
        ),
        sightings=timelines.detector_sightings(events),
        reports=reports,
        cached=cached,
    )
