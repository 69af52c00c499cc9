"""One audit run: read the window's events over JDBC and the pending lists from Redis, apply
`reconcile`'s rules, and hand the findings to `summary` to write."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rig_conductor.audit.session import AuditOptions
from rig_conductor.audit.stages import Findings, Loaded, ms_since
from rig_conductor.audit.summary import LATENCY_BINS, summarize, write_outputs
from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rig_conductor.audit.sources import JdbcSource, RedisSnapshot

logger = logging.getLogger(__name__)

Make = Callable[[], "DataFrame"]  # builds a frame's plan, in the writer thread


# ------------------------------------------------------------------------------------------ run


STAGED = "events.staging"  # under the output directory while the audit runs; removed at the end
BROADCAST_AT_MOST = 200_000  # rows of a small frame sent whole to every task instead of shuffled
WRITERS = 4  # small tables written at once


@contextmanager
def _timed(timings: dict[str, int], name: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0) + ms_since(started)


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
            snapshot = _read_redis(settings, streams)
        # On a live system an entry finished between the event read and the Redis read has left
        # its pending list, but its completion was logged after the read: take it from the tail.
        if options.until is None and loaded.bounds.high is not None:
            with _timed(timings, "readMs"):
                load_tail(spark, source, loaded, tenant=settings.tenant)
        with _timed(timings, "computeMs"):
            findings = _reconcile(spark, loaded, snapshot, settings, options, window_end)
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


def _read_redis(settings: Settings, streams: list[str]) -> RedisSnapshot:
    from rig_conductor.audit import sources

    client = sources.connect(settings)
    try:
        return sources.read_redis(client, streams=streams)
    finally:
        client.close()


def _reconcile(
    spark: SparkSession,
    loaded: Loaded,
    snapshot: RedisSnapshot,
    settings: Settings,
    options: AuditOptions,
    window_end: datetime,
) -> Findings:
    first = options.since or loaded.bounds.first_at or window_end
    return reconcile_all(
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
    from rig_conductor.audit import sources, vocabulary

    where = sources.event_filter(tenant=tenant, since=since, until=until)
    bounds = sources.read_bounds(spark, source, where=where)
    parallelism = spark.sparkContext.defaultParallelism
    count = partitions or sources.partitions_for(bounds.rows, parallelism=parallelism)
    empty = bounds.rows == 0 or bounds.high is None
    if empty:
        events = spark.createDataFrame([], vocabulary.EVENTS_SCHEMA)
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
        events = _staged(spark, events, staging)
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


def _staged(spark: SparkSession, events: DataFrame, staging: Path) -> DataFrame:
    """`events` written to `staging` as Parquet partitioned by kind, and read back from there."""
    from rig_conductor.audit import vocabulary

    path = str((staging / "events").resolve())
    events.write.mode("overwrite").partitionBy("kind").parquet(path)
    columns = [f.name for f in vocabulary.EVENTS_SCHEMA.fields]
    return spark.read.schema(vocabulary.EVENTS_SCHEMA).parquet(path).select(*columns)


def load_tail(spark: SparkSession, source: JdbcSource, loaded: Loaded, *, tenant: str) -> None:
    """Completions and dead letters logged after the window's read, added to `loaded.events`."""
    from rig_conductor.audit import sources, vocabulary

    assert loaded.bounds.high is not None
    tail = sources.read_events(
        spark,
        source,
        where=sources.event_filter(
            tenant=tenant,
            after_id=loaded.bounds.high,
            kinds=(vocabulary.WORK_COMPLETED, vocabulary.DEAD_LETTERED),
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

    from rig_conductor.audit import vocabulary

    rows = (
        events.where(
            F.col("kind").isin(vocabulary.ISSUE_ASSIGNED, vocabulary.DEAD_LETTER_REQUEUED)
            & F.col("stream").isNotNull()
        )
        .select("stream")
        .distinct()
        .collect()
    )
    return sorted(str(row["stream"]) for row in rows)


@dataclass(frozen=True, slots=True)
class _Parquet:
    """Writes a frame once, as a table under the output or an intermediate frame under the
    staging directory, and hands on the frame read back from it."""

    spark: SparkSession
    output: Path
    staging: Path

    def table(self, frame: DataFrame, name: str, *, one_file: bool = True) -> DataFrame:
        return self._write(frame, self.output / name, one_file=one_file)

    def staged(self, frame: DataFrame, name: str) -> DataFrame:
        return self._write(frame, self.staging / name, one_file=False)

    def _write(self, frame: DataFrame, directory: Path, *, one_file: bool) -> DataFrame:
        path, started = str(directory.resolve()), time.perf_counter()
        (frame.coalesce(1) if one_file else frame).write.mode("overwrite").parquet(path)
        logger.debug("Wrote %s in %d ms", directory.name, ms_since(started))
        return self.spark.read.parquet(path)


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
    from rig_conductor.audit import reconcile as rc
    from rig_conductor.audit import timelines, vocabulary

    pending = spark.createDataFrame(snapshot.pending, vocabulary.PENDING_SCHEMA, verifySchema=False)
    queue = spark.createDataFrame(
        snapshot.letters, vocabulary.DEAD_LETTER_QUEUE_SCHEMA, verifySchema=False
    )
    out = _Parquet(spark, output, staging)
    # Small frames first, each written: read back, their size lets the joins below broadcast
    # them instead of shuffling the log against them.
    replaced = out.staged(rc.replaced_dispatches(events), "replaced")
    unpublished = out.staged(rc.unpublished_completions(events), "unpublished")
    requeues = out.staged(rc.unmatched_requeues(events), "requeues")
    dead = out.table(rc.dead_letters(events, queue), "dead_letters")
    # The per-entry table keeps Spark's partitioning: it is as large as the log.
    facts = out.staged(rc.entry_facts(events, replaced, unpublished), "facts")
    few = requeues.count() <= BROADCAST_AT_MOST
    status = out.table(
        rc.entry_status(facts, dead, pending, requeues, broadcast_matches=few),
        "entries",
        one_file=False,
    )
    reports = out.staged(rc.work_reports(events, status, unpublished), "reports")
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="audit-write") as pool:
        rest = _write_the_rest(
            pool,
            out,
            events,
            intervals,
            status=status,
            facts=facts,
            reports=reports,
            window_end=window_end,
            down_ms=down_ms,
            span_ms=span_ms,
        )
    found = {name: future.result() for name, future in rest.items()}
    latency = timelines.reclaim_latency(found["reclaims"])
    return Findings(status=status, dead_letters=dead, reports=reports, latency=latency, **found)


def _write_the_rest(
    pool: ThreadPoolExecutor,
    out: _Parquet,
    events: DataFrame,
    intervals: DataFrame | None,
    *,
    status: DataFrame,
    facts: DataFrame,
    reports: DataFrame,
    window_end: datetime,
    down_ms: int,
    span_ms: float,
) -> dict[str, Future[DataFrame]]:
    """The small jobs after the per-entry table, written a few at a time (their time is mostly
    latency: planning, scheduling, file commits). Each waits only for jobs submitted before it,
    so the pool cannot stall on its own queue. Returns the futures by `Findings` field."""
    from rig_conductor.audit import duplicates, tallies, timelines
    from rig_conductor.audit import reconcile as rc

    def table(name: str, make: Make, *, one_file: bool = True) -> Future[DataFrame]:
        return pool.submit(lambda: out.table(make(), name, one_file=one_file))

    def staged(name: str, make: Make) -> Future[DataFrame]:
        return pool.submit(lambda: out.staged(make(), name))

    found: dict[str, Future[DataFrame]] = {}
    # Only entries worked under several attempts can overlap: their reports, not all.
    reattempted = staged("reattempted", lambda: rc.reattempted(facts))
    several = staged("several", lambda: duplicates.completed_by_several(reports))
    found["reclaims"] = table("reclaims", lambda: timelines.reclaims(events), one_file=False)
    gaps = staged(
        "gaps", lambda: timelines.heartbeat_gaps(events, intervals, window_end=window_end)
    )
    found["lost"] = table("lost", lambda: tallies.lost(status))
    found["dead_letter_rate"] = table("dead_letter_rate", lambda: tallies.dead_letter_rate(status))
    bucket_ms = timelines.choose_bucket_ms(span_ms)
    found["pending_over_time"] = table(
        "pending_over_time", lambda: timelines.pending_over_time(status, bucket_ms=bucket_ms)
    )
    found["sightings"] = table("detector_sightings", lambda: timelines.detector_sightings(events))
    found["overlaps"] = table(
        "overlapping_attempts",
        lambda: duplicates.overlapping_attempts(reports, reattempted.result()),
    )
    found["duplicates"] = table(
        "duplicates",
        lambda: duplicates.duplicates(reports, found["overlaps"].result(), several.result()),
    )
    found["histogram"] = table(
        "reclaim_latency_histogram",
        lambda: timelines.latency_histogram(found["reclaims"].result(), LATENCY_BINS),
    )
    found["availability"] = table(
        "availability", lambda: timelines.availability(gaps.result(), down_ms=down_ms)
    )
    found["down_periods"] = table(
        "agent_down_periods", lambda: timelines.down_periods(gaps.result(), down_ms=down_ms)
    )
    return found
