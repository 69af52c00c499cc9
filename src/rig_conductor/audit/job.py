"""One audit run: read the window's events over JDBC and the pending lists from Redis, apply
`reconcile`'s rules, and hand the findings to `summary` to write."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
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


STAGED = "events.staging"  # under the output directory while the audit runs; removed at the end
BROADCAST_AT_MOST = 200_000  # rows of a small frame sent whole to every task instead of shuffled
WRITERS = 4  # small tables written at once


@dataclass
class Loaded:
    """The window's events, read once, with what the read found."""

    events: DataFrame
    # The agents' liveness intervals in the window (small: one row per unbroken stretch).
    intervals: DataFrame
    bounds: EventBounds
    rows: int
    partitions: int
    cached: list[DataFrame] = field(default_factory=list)
    staged: Path | None = None

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)


@dataclass
class Findings:
    """The reconciled frames, each read back from the Parquet it was written to."""

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
            staging=options.output / STAGED,
        )
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
                intervals=loaded.intervals,
                window_end=window_end,
                down_ms=settings.agent_down_ms,
                span_ms=max((window_end - first).total_seconds() * 1000, 0.0),
                output=options.output,
                staging=options.output / STAGED,
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
    return summary


def load_events(
    spark: SparkSession,
    source: JdbcSource,
    *,
    tenant: str,
    since: datetime | None,
    until: datetime | None,
    partitions: int | None,
    staging: Path | None = None,
) -> Loaded:
    """Read the window's events with a partitioned JDBC read on `id`, once.

    The read stops at the highest id the bounds query saw, so every partition reads the same
    snapshot of a log that keeps growing. With `staging` (a directory every executor reaches,
    as the output must be), the rows are written there as Parquet partitioned by `kind` and
    every rule reads that: each scans only its kinds and columns, and no executor holds the
    whole log in memory. Without, they are cached.
    """
    from rig_conductor.audit import reconcile, sources

    where = sources.event_filter(tenant=tenant, since=since, until=until)
    bounds = sources.read_bounds(spark, source, where=where)
    parallelism = spark.sparkContext.defaultParallelism
    count = partitions or sources.partitions_for(bounds.rows, parallelism=parallelism)
    empty = bounds.rows == 0 or bounds.high is None
    if empty:
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
    cached: list[DataFrame] = []
    if staging is not None and not empty:
        path = str((staging / "events").resolve())
        events.write.mode("overwrite").partitionBy("kind").parquet(path)
        columns = [f.name for f in reconcile.EVENTS_SCHEMA.fields]
        events = spark.read.schema(reconcile.EVENTS_SCHEMA).parquet(path).select(*columns)
    else:
        events = events.persist()
        cached.append(events)
    rows = events.count()
    logger.info(
        "Read %d events (ids %s to %s) in %d JDBC partitions", rows, bounds.low, bounds.high, count
    )
    intervals = sources.read_intervals(
        spark, source, tenant=tenant, since=since, until=until
    ).persist()
    cached.append(intervals)
    return Loaded(
        events=events,
        intervals=intervals,
        bounds=bounds,
        rows=rows,
        partitions=count,
        cached=cached,
        staged=staging,
    )


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
    intervals: DataFrame | None = None,
    window_end: datetime,
    down_ms: int,
    span_ms: float,
    output: Path,
    staging: Path,
) -> Findings:
    """Apply every rule, writing each result once as it is needed: the tables under `output`,
    the intermediate frames under `staging`.

    Every frame handed on is read back from its Parquet, so the plans after it stay small (one
    scan, not the whole lineage: planning a lineage this size again for each table and count
    cost more than the work on a small log) and nothing is cached in executor memory.
    """
    from rig_conductor.audit import duplicates, tallies, timelines
    from rig_conductor.audit import reconcile as rc

    pending = spark.createDataFrame(snapshot.pending, rc.PENDING_SCHEMA, verifySchema=False)
    queue = spark.createDataFrame(snapshot.letters, rc.DEAD_LETTER_QUEUE_SCHEMA, verifySchema=False)

    def write(frame: DataFrame, directory: Path, *, one_file: bool = True) -> DataFrame:
        path, started = str(directory.resolve()), time.perf_counter()
        (frame.coalesce(1) if one_file else frame).write.mode("overwrite").parquet(path)
        logger.debug("Wrote %s in %d ms", directory.name, _ms_since(started))
        return spark.read.parquet(path)

    def table(frame: DataFrame, name: str, *, one_file: bool = True) -> DataFrame:
        return write(frame, output / name, one_file=one_file)

    def staged(frame: DataFrame, name: str) -> DataFrame:
        return write(frame, staging / name, one_file=False)

    # Small frames first, each written: read back, their size lets the joins below broadcast
    # them instead of shuffling the log against them.
    replaced = staged(rc.replaced_dispatches(events), "replaced")
    requeues = staged(rc.unmatched_requeues(events), "requeues")
    dead = table(rc.dead_letters(events, queue), "dead_letters")
    # The per-entry table keeps Spark's partitioning: it is as large as the log.
    facts = staged(rc.entry_facts(events, replaced), "facts")
    few = requeues.count() <= BROADCAST_AT_MOST
    status = table(
        rc.entry_status(facts, dead, pending, requeues, broadcast_matches=few),
        "entries",
        one_file=False,
    )
    reports = staged(rc.work_reports(events, status), "reports")
    # The rest are small jobs, most of whose time is latency (planning, scheduling, file
    # commits): written a few at a time. Each waits only for frames submitted before it, so the
    # pool cannot stall on its own queue.
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="audit-write") as pool:
        # Only entries worked under several attempts can overlap: their reports, not all.
        reattempted = pool.submit(lambda: staged(rc.reattempted(facts), "reattempted"))
        several = pool.submit(lambda: staged(duplicates.completed_by_several(reports), "several"))
        reclaims = pool.submit(
            lambda: table(timelines.reclaims(events), "reclaims", one_file=False)
        )
        gaps = pool.submit(
            lambda: staged(
                timelines.heartbeat_gaps(events, intervals, window_end=window_end), "gaps"
            )
        )
        lost = pool.submit(lambda: table(tallies.lost(status), "lost"))
        rate = pool.submit(lambda: table(tallies.dead_letter_rate(status), "dead_letter_rate"))
        bucket_ms = timelines.choose_bucket_ms(span_ms)
        over_time = pool.submit(
            lambda: table(
                timelines.pending_over_time(status, bucket_ms=bucket_ms), "pending_over_time"
            )
        )
        sightings = pool.submit(
            lambda: table(timelines.detector_sightings(events), "detector_sightings")
        )
        overlaps = pool.submit(
            lambda: table(
                duplicates.overlapping_attempts(reports, reattempted.result()),
                "overlapping_attempts",
            )
        )
        found_twice = pool.submit(
            lambda: table(
                duplicates.duplicates(reports, overlaps.result(), several.result()),
                "duplicates",
            )
        )
        histogram = pool.submit(
            lambda: table(
                timelines.latency_histogram(reclaims.result(), LATENCY_BINS),
                "reclaim_latency_histogram",
            )
        )
        availability = pool.submit(
            lambda: table(timelines.availability(gaps.result(), down_ms=down_ms), "availability")
        )
        down_periods = pool.submit(
            lambda: table(
                timelines.down_periods(gaps.result(), down_ms=down_ms), "agent_down_periods"
            )
        )
    return Findings(
        status=status,
        lost=lost.result(),
        duplicates=found_twice.result(),
        overlaps=overlaps.result(),
        reclaims=reclaims.result(),
        latency=timelines.reclaim_latency(reclaims.result()),
        histogram=histogram.result(),
        availability=availability.result(),
        down_periods=down_periods.result(),
        dead_letter_rate=rate.result(),
        dead_letters=dead,
        pending_over_time=over_time.result(),
        sightings=sightings.result(),
        reports=reports,
    )
