"""`rig-conductor audit`: reconcile the event log with Redis and write what went wrong.

The I/O half of the audit, in order: start (or join) a Spark session, read the window's events
over JDBC, snapshot the pending lists and dead-letter queues of the dispatched streams, apply
`reconcile`'s rules, then write Parquet tables, the plots, report.html and, last, summary.json.
PySpark and matplotlib are imported when the command runs, never when the CLI is built, so the
rest of rig-conductor works without the `audit` extra. Must not import the API or the reaper.

Besides `rig-conductor audit`, it runs as `python -m rig_conductor.audit` and under spark-submit:

    spark-submit --master spark://host:7077 --jars /usr/share/java/postgresql.jar \\
        "$(python -c 'import rig_conductor.audit.main as m; print(m.__file__)')" --output DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rig_conductor.settings import Settings, SettingsError, load_settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

    from rig_conductor.audit import report
    from rig_conductor.audit.sources import EventBounds, JdbcSource, RedisSnapshot

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
JDBC_JAR_ENV = "RIG_JDBC_JAR"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
MIN_JAVA = 17
LATENCY_BINS = 40
TIMELINE_DOWN_PERIODS = 20_000  # down periods drawn in the availability plot, at most


class AuditError(Exception):
    """An operator mistake or a missing prerequisite: one line, exit 2."""


# ---------------------------------------------------------------------------------- command line


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `audit` on the CLI's subparsers; the command is `main(args, settings)`."""
    parser = subparsers.add_parser(
        "audit",
        help="reconcile the event log with Redis (PySpark): lost, duplicate, dead-lettered work",
        description="Reads the event log over JDBC and the pending lists and dead-letter queues "
        "from Redis, and writes DIR/summary.json, Parquet tables and DIR/report.html.",
    )
    configure_parser(parser)
    parser.set_defaults(command=main)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        type=parse_instant,
        metavar="ISO",
        help="events at or after this instant (ISO 8601; UTC when it has no offset)",
    )
    parser.add_argument(
        "--until", type=parse_instant, metavar="ISO", help="events before this instant"
    )
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="DIR",
        help="where summary.json, report.html and the Parquet tables go (created if missing)",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: spark-submit's, else local[*])",
    )
    parser.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="JDBC read partitions (default: one per 250,000 events, at most two per core)",
    )
    parser.add_argument(
        "--conf",
        type=_spark_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable)",
    )


def parse_instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _spark_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


@dataclass(frozen=True, slots=True)
class AuditOptions:
    output: Path
    since: datetime | None = None
    until: datetime | None = None
    master: str | None = None
    partitions: int | None = None
    conf: Sequence[tuple[str, str]] = ()
    jdbc_jar: Path = Path(DEFAULT_JDBC_JAR)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> AuditOptions:
        return cls(
            output=Path(args.output),
            since=args.since,
            until=args.until,
            master=args.master,
            partitions=args.partitions,
            conf=tuple(args.conf or ()),
            jdbc_jar=Path(environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR),
        )


def main(args: argparse.Namespace, settings: Settings) -> int:
    """The `audit` command: 0 once the findings are written, whatever they say."""
    options = AuditOptions.from_args(args, os.environ)
    try:
        source = preflight(options, settings)
    except AuditError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    started = time.perf_counter()
    try:
        spark, owned = spark_session(options)
    except Exception as exc:
        logger.error("Spark did not start: %s", describe(exc))
        return EXIT_FAILED
    timings = {"sparkStartMs": _ms_since(started)}
    try:
        summary = run(spark, settings=settings, options=options, source=source, timings=timings)
    except Exception as exc:
        logger.error("Audit failed: %s", describe(exc))
        return EXIT_FAILED
    finally:
        if owned:
            spark.stop()
    logger.info(
        "Audit done: %d dispatched, %d completed, %d dead-lettered, %d pending, %d lost, "
        "%d duplicates, %d reclaims; wrote %s",
        summary["dispatched"],
        summary["completed"],
        summary["deadLettered"],
        summary["pending"],
        len(summary["lost"]),
        len(summary["duplicates"]),
        summary["reclaims"],
        options.output / "summary.json",
    )
    return EXIT_OK


def preflight(options: AuditOptions, settings: Settings) -> JdbcSource:
    """Everything checkable before Spark starts; raises AuditError with one line."""
    try:
        import matplotlib  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise AuditError(
            f"the audit needs PySpark and matplotlib ({exc.name} is missing): "
            "pip install 'rig-conductor[audit]'"
        ) from None
    from rig_conductor.audit import sources

    if options.since and options.until and options.since >= options.until:
        raise AuditError("--since must be before --until")
    if options.output.exists() and not options.output.is_dir():
        raise AuditError(f"--output {options.output} exists and is not a directory")
    if not options.jdbc_jar.is_file():
        raise AuditError(
            f"{JDBC_JAR_ENV}: no PostgreSQL JDBC driver at {options.jdbc_jar} (install Debian's "
            f"libpostgresql-jdbc-java, or point {JDBC_JAR_ENV} at postgresql-<version>.jar)"
        )
    if not _jvm_running():
        check_java()
    try:
        return sources.jdbc_source(settings.sqlalchemy_url)
    except sources.SourceError as exc:
        raise AuditError(str(exc)) from None


def _jvm_running() -> bool:
    """spark-submit starts the JVM before Python and says where to reach it."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def check_java() -> None:
    """PySpark 4 needs Java 17+, found the way Spark finds it: JAVA_HOME, else PATH."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise AuditError(
            f"the audit needs Java {MIN_JAVA}+ and found none "
            f"({'JAVA_HOME=' + java_home if java_home else 'no java on PATH'})"
        )
    try:
        answer = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AuditError(f"{java} -version failed: {exc}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', answer.stderr + answer.stdout)
    if found is None:
        raise AuditError(f"{java} -version did not say which version it is")
    major = int(found.group(2) or 0) if found.group(1) == "1" else int(found.group(1))
    if major < MIN_JAVA:
        raise AuditError(f"the audit needs Java {MIN_JAVA}+; {java} is Java {major}")


def describe(exc: BaseException) -> str:
    """One line for a failure; for one raised in the JVM, its root cause (the driver's own
    message, such as `PSQLException: Connection to host:5432 refused`) after Spark's."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    line = f"{type(exc).__name__}: {first}"
    throwable = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    root = ""
    try:
        throwable = throwable.getCause() if throwable is not None else None
        while throwable is not None:
            described = str(throwable.toString())
            # The deepest cause, but PostgreSQL's driver says best what went wrong.
            if not root.startswith("org.postgresql.") or described.startswith("org.postgresql."):
                root = described
            throwable = throwable.getCause()
    except Exception:  # the JVM may be gone already; Spark's own line is still there
        root = ""
    root = root.strip().splitlines()[0] if root.strip() else ""
    if not root:
        return line
    name, _, message = root.partition(": ")
    short = name.rsplit(".", 1)[-1]
    return f"{line} ({short}: {message})" if message else f"{line} ({short})"


def _ms_since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)


# -------------------------------------------------------------------------------------- session


def spark_session(options: AuditOptions) -> tuple[SparkSession, bool]:
    """The session to run in, and whether this run owns it (and so stops it).

    A session that already exists in this process (a notebook, a test) is used as it is.
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:
        existing = SparkSession.active()
    except PySparkRuntimeError:
        existing = None
    if existing is not None:
        logger.info("Running in the existing Spark session (%s)", existing.sparkContext.master)
        return existing, False
    master = options.master or (None if _jvm_running() else "local[*]")
    builder = SparkSession.builder.appName("rig-conductor-audit")
    if master is not None:
        builder = builder.master(master)
    for key, value in spark_conf(options, master).items():
        builder = builder.config(key, value)
    return builder.getOrCreate(), True


def spark_conf(options: AuditOptions, master: str | None) -> dict[str, str]:
    """Small defaults for a small machine; every one can be overridden with --conf."""
    conf = {
        "spark.jars": str(options.jdbc_jar),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
    }
    if master is not None and master.startswith("local"):
        conf["spark.ui.enabled"] = "false"  # no port 4040 to fight over with other jobs
        conf["spark.sql.shuffle.partitions"] = str(local_shuffle_partitions(master))
    conf.update(options.conf)
    return conf


def local_shuffle_partitions(master: str) -> int:
    """Two per core of `local[N]` (`local[*]`: this machine's), between 4 and 16."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    cores = 1
    if found and found.group(1) and found.group(1) != "*":
        cores = int(found.group(1))
    elif found and found.group(1) == "*":
        cores = os.cpu_count() or 1
    return max(4, min(16, 2 * cores))


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
    overlaps = keep(rc.overlapping_attempts(reports))
    reclaims = keep(rc.reclaims(events))
    gaps = keep(rc.heartbeat_gaps(events, window_end=window_end))
    return Findings(
        status=status,
        lost=rc.lost(status),
        duplicates=keep(rc.duplicates(reports, overlaps)),
        overlaps=overlaps,
        reclaims=reclaims,
        latency=rc.reclaim_latency(reclaims),
        histogram=rc.latency_histogram(reclaims, LATENCY_BINS),
        availability=keep(rc.availability(gaps, down_ms=down_ms)),
        down_periods=rc.down_periods(gaps, down_ms=down_ms),
        dead_letter_rate=rc.dead_letter_rate(status),
        dead_letters=dead,
        pending_over_time=rc.pending_over_time(status, bucket_ms=rc.choose_bucket_ms(span_ms)),
        sightings=rc.detector_sightings(events),
        reports=reports,
        cached=cached,
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _ms(value: float | None) -> int:
    return 0 if value is None else round(value)


def summarize(
    findings: Findings,
    *,
    settings: Settings,
    options: AuditOptions,
    loaded: Loaded,
    snapshot: RedisSnapshot,
    window_end: datetime,
) -> tuple[dict[str, Any], report.ReportData]:
    """Collect the findings' small results into summary.json's shape and the report's data.

    `lost` and `duplicates` carry exactly the contract's keys; the details are in Parquet.
    """
    from pyspark.sql import functions as F

    from rig_conductor.audit import reconcile as rc

    totals = _one(findings.status.transform(_totals))
    latency = _one(findings.latency)
    lost = findings.lost.select("stream", "entry_id", "issue_id").collect()
    duplicates = findings.duplicates.select("issue_id", "consumers").collect()
    agents = findings.availability.collect()
    rates = findings.dead_letter_rate.collect()
    fenced = findings.reports.where(F.col("fenced")).count()
    sightings = findings.sightings.count()
    summary: dict[str, Any] = {
        "dispatched": totals["dispatched"],
        "completed": totals["completed"],
        "deadLettered": totals["dead_lettered"],
        "pending": totals["pending"],
        "lost": [
            {"stream": r["stream"], "entryId": r["entry_id"], "issueId": r["issue_id"]}
            for r in lost
        ],
        "duplicates": [
            {"issueId": r["issue_id"], "consumers": list(r["consumers"])} for r in duplicates
        ],
        "reclaims": latency["reclaims"],
        "reclaimsByReason": {
            r["reason"]: r["reclaims"] for r in rc.reclaims_by_reason(findings.reclaims).collect()
        },
        "reclaimLatencyMs": {
            "p50": _ms(latency["p50"]),
            "p95": _ms(latency["p95"]),
            "max": _ms(latency["max"]),
        },
        "tenant": settings.tenant,
        "window": {
            "since": _iso(options.since),
            "until": _iso(options.until),
            "end": _iso(window_end),
            "redisReadAt": _iso(snapshot.taken_at),
        },
        "events": loaded.rows,
        "jdbcPartitions": loaded.partitions,
        "requeued": totals["requeued"],
        "pendingInPel": totals["pending_in_pel"],
        "pendingUndelivered": totals["pending_undelivered"],
        "deadLetteredOutsideLog": totals["dead_lettered_outside_log"],
        "completedStillPending": totals["completed_still_pending"],
        "reclaimLatencySamples": latency["measured"],
        "overlappingAttemptReports": findings.overlaps.count(),
        "fencedReports": fenced,
        "consumersWithoutHeartbeat": sightings,
        "agentDownMs": settings.agent_down_ms,
        "agents": [
            {
                "agentId": a["agent_id"],
                "availability": round(float(a["availability"]), 6),
                "downMs": _ms(a["down_ms"]),
                "detectedDownMs": _ms(a["detected_down_ms"]),
                "downPeriods": a["down_periods"],
                "downAtEnd": bool(a["down_at_end"]),
                "heartbeats": a["heartbeats"],
                "lastHeartbeatAt": _iso(a["last_heartbeat"]),
            }
            for a in agents
        ],
        "deadLetterRate": [
            {
                "stream": r["stream"],
                "dispatched": r["dispatched"],
                "deadLettered": r["dead_lettered"],
                "rate": r["dead_letter_rate"],
            }
            for r in rates
        ],
        "redis": {
            "streams": snapshot.streams,
            "missingStreams": snapshot.missing,
            "groups": snapshot.groups,
            "pendingEntries": len(snapshot.pending),
            "deadLetters": len(snapshot.letters),
        },
    }
    return summary, _report_data(findings, agents, window_end)


def _totals(status: DataFrame) -> DataFrame:
    from rig_conductor.audit import reconcile

    return reconcile.totals(status)


def _one(frame: DataFrame) -> Row:
    row = frame.first()
    assert row is not None  # an aggregate without grouping always answers one row
    return row


def _report_data(findings: Findings, agents: list[Row], window_end: datetime) -> report.ReportData:
    from pyspark.sql import functions as F

    from rig_conductor.audit import report

    shown = [a["agent_id"] for a in agents[: report.MAX_TIMELINE_AGENTS]]
    periods: dict[str, list[tuple[datetime, datetime]]] = {}
    if shown:
        rows = (
            findings.down_periods.where(F.col("agent_id").isin(shown))
            .limit(TIMELINE_DOWN_PERIODS)
            .collect()
        )
        for row in rows:
            periods.setdefault(row["agent_id"], []).append(
                (row["down_from"].astimezone(UTC), row["down_until"].astimezone(UTC))
            )
    return report.ReportData(
        latency_bins=[
            report.HistogramBin(r["bin_start_ms"], r["bin_end_ms"], r["count"])
            for r in findings.histogram.collect()
        ],
        timelines=[
            report.AgentTimeline(
                a["agent_id"],
                a["first_heartbeat"].astimezone(UTC),
                float(a["availability"]),
                periods.get(a["agent_id"], []),
            )
            for a in agents
        ],
        window_end=window_end,
        pending=[
            report.PendingPoint(
                r["bucket_start"].astimezone(UTC), r["dispatched"], r["finished"], r["outstanding"]
            )
            for r in findings.pending_over_time.collect()
        ],
    )


def write_outputs(
    findings: Findings,
    summary: dict[str, Any],
    data: report.ReportData,
    directory: Path,
    *,
    timings: Mapping[str, int] | None = None,
) -> None:
    """Parquet tables, plots and report.html, then summary.json (written whole, last)."""
    from dataclasses import replace

    from rig_conductor.audit import report

    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    tables: dict[str, str] = {}
    for name, frame in findings.tables().items():
        # Small tables in one file each; the per-entry table keeps Spark's partitioning.
        out = frame if name in ("entries", "reclaims") else frame.coalesce(1)
        out.write.mode("overwrite").parquet(str(directory.resolve() / name))
        tables[name] = name
    summary["tables"] = tables
    data = replace(data, tables=tables)
    plots = report.write_plots(directory, summary, data)
    summary["plots"] = plots
    report.write_html(directory / "report.html", summary, data, plots)
    if timings is not None:
        summary["timingsMs"] = {**timings, "writeMs": _ms_since(started)}
    partial = directory / "summary.json.partial"
    partial.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    partial.replace(directory / "summary.json")


# ------------------------------------------------------------------------- spark-submit entry


def run_from_environment(argv: Sequence[str] | None = None) -> int:
    """`python -m rig_conductor.audit` and spark-submit: settings from the RIG_* environment."""
    from rig_conductor import logs

    parser = argparse.ArgumentParser(
        prog="rig-conductor-audit", description="rig-conductor's PySpark reconciliation job"
    )
    configure_parser(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
    except SettingsError as exc:
        print(f"rig-conductor audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(settings.log_format)
    return main(args, settings)


if __name__ == "__main__":
    sys.exit(run_from_environment())
