"""The audit's rules as pure DataFrame transforms: event log and Redis snapshot in, findings out.

No I/O and no clock: frames come in (rows of `events`, the pending entries and dead letters that
Redis held when it was read) and lazy frames go out. `main` reads the sources, passes the instant
the window ends and the thresholds, caches what it reuses and writes the results. Every function
here runs on small hand-built frames in the unit tests.

An entry is `(stream, entry_id)`. Each dispatched entry ends in exactly one status, checked in
this order: completed (an accepted, non-fenced WORK_COMPLETED), dead-lettered (a DEAD_LETTERED
row, a letter in `<stream>:dlq`, or a requeue of a letter that never reached the log), pending
(in a pending entries list, or not yet delivered to a group), else lost.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

ISSUE_ASSIGNED = "ISSUE_ASSIGNED"
WORK_STARTED = "WORK_STARTED"
WORK_COMPLETED = "WORK_COMPLETED"
WORK_FAILED = "WORK_FAILED"
WORK_PROGRESS = "WORK_PROGRESS"
WORK_KINDS = (WORK_STARTED, WORK_PROGRESS, WORK_COMPLETED, WORK_FAILED)
RECLAIMED = "RECLAIMED"
DEAD_LETTERED = "DEAD_LETTERED"
DEAD_LETTER_REQUEUED = "DEAD_LETTER_REQUEUED"
HEARTBEAT = "HEARTBEAT"
CONSUMER_WITHOUT_HEARTBEAT = "CONSUMER_WITHOUT_HEARTBEAT"
# The kinds whose `detail` the rules read; other rows may carry it as NULL. ISSUE_ASSIGNED's
# `replaces` names the entry a dispatch Redis lost was appended again in place of.
DETAIL_KINDS = (ISSUE_ASSIGNED, RECLAIMED, DEAD_LETTERED, DEAD_LETTER_REQUEUED)

COMPLETED, DEAD, PENDING, LOST = "completed", "dead_lettered", "pending", "lost"
IN_PEL, UNDELIVERED = "pel", "undelivered"
BY_SEVERAL_CONSUMERS = "completed-by-several-consumers"
OVERLAPPING_ATTEMPTS = "overlapping-attempts"

ENTRY = ["stream", "entry_id"]

# The `events` table as the audit reads it. `detail` is the JSON text (NULL where unused);
# `entry_ids` lists the entries of a row about several (a reclaimed batch), else NULL.
EVENTS_SCHEMA = StructType(
    [
        StructField("id", LongType(), False),
        StructField("occurred_at", TimestampType(), False),
        StructField("kind", StringType(), False),
        StructField("agent_id", StringType()),
        StructField("consumer", StringType()),
        StructField("stream", StringType()),
        StructField("group_name", StringType()),
        StructField("entry_id", StringType()),
        StructField("issue_id", StringType()),
        StructField("attempt", IntegerType()),
        StructField("fenced", BooleanType(), False),
        StructField("detail", StringType()),
        StructField("entry_ids", ArrayType(StringType())),
    ]
)

# What Redis held when it was read: entries in a group's pending list (`pel`, with the owning
# consumer) or still in the stream above a group's last-delivered id (`undelivered`).
PENDING_SCHEMA = StructType(
    [
        StructField("stream", StringType(), False),
        StructField("entry_id", StringType(), False),
        StructField("group_name", StringType()),
        StructField("consumer", StringType()),
        StructField("state", StringType(), False),
    ]
)

# One letter of `<stream>:dlq`, whoever wrote it (the reaper or the agent runtime).
DEAD_LETTER_QUEUE_SCHEMA = StructType(
    [
        StructField("stream", StringType(), False),
        StructField("dlq_id", StringType(), False),
        StructField("original_id", StringType()),
        StructField("group_name", StringType()),
        StructField("consumer", StringType()),
        StructField("deliveries", IntegerType()),
        StructField("reason", StringType()),
        StructField("issue_id", StringType()),
    ]
)


def stream_id_ms(column: str | Column) -> Column:
    """The millisecond part of a Redis stream id (`<ms>-<seq>`): when Redis added the entry."""
    return F.split_part(
        F.col(column) if isinstance(column, str) else column, F.lit("-"), F.lit(1)
    ).try_cast("long")


def stream_id_seq(column: str | Column) -> Column:
    return F.split_part(
        F.col(column) if isinstance(column, str) else column, F.lit("-"), F.lit(2)
    ).try_cast("long")


def entry_order(stream: str = "stream", entry_id: str = "entry_id") -> list[Column]:
    """Sort keys that put stream ids in stream order (`9-0` before `10-0`)."""
    return [F.col(stream), stream_id_ms(entry_id), stream_id_seq(entry_id), F.col(entry_id)]


def _millis_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1000.0)


def _json(field: str) -> Column:
    return F.get_json_object(F.col("detail"), f"$.{field}")


def per_entry(events: DataFrame) -> DataFrame:
    """Rows about several entries at once (`entry_ids`) as one row per entry; drops `entry_ids`."""
    single = events.where(F.col("entry_ids").isNull()).drop("entry_ids")
    several = events.where(F.col("entry_ids").isNotNull()).withColumn(
        "entry_id", F.explode("entry_ids")
    )
    return single.unionByName(several.drop("entry_ids"))


def dispatched(events: DataFrame) -> DataFrame:
    """One row per dispatched entry.

    ISSUE_ASSIGNED rows, and DEAD_LETTER_REQUEUED rows: a dead letter put back on its stream is a
    new entry (with the same issue) that has to be worked like any other. An entry a later
    ISSUE_ASSIGNED `replaces` (Redis lost it before anyone started it, and the conductor
    appended the dispatch again) is not counted: its replacement is.
    Columns: stream, entry_id, issue_id, agent_id, dispatched_at, dispatch_event_id, origin
    (`assigned` / `requeued`), requeued_from (the DLQ id a requeued entry came from).
    """
    rows = events.where(
        F.col("kind").isin(ISSUE_ASSIGNED, DEAD_LETTER_REQUEUED)
        & F.col("stream").isNotNull()
        & F.col("entry_id").isNotNull()
    )
    first = F.min_by(F.struct("id", "kind", "issue_id", "agent_id", "occurred_at", "detail"), "id")
    requeued = F.col("first.kind") == DEAD_LETTER_REQUEUED
    replaced = (
        rows.where(F.col("kind") == ISSUE_ASSIGNED)
        .select("stream", F.get_json_object("detail", "$.replaces").alias("entry_id"))
        .where(F.col("entry_id").isNotNull())
    )
    return (
        rows.join(replaced, ENTRY, "left_anti")
        .groupBy(*ENTRY)
        .agg(first.alias("first"), F.max("issue_id").alias("any_issue"))
        .select(
            *ENTRY,
            F.coalesce("first.issue_id", "any_issue").alias("issue_id"),
            F.col("first.agent_id").alias("agent_id"),
            F.col("first.occurred_at").alias("dispatched_at"),
            F.col("first.id").alias("dispatch_event_id"),
            F.when(requeued, F.lit("requeued")).otherwise(F.lit("assigned")).alias("origin"),
            F.when(requeued, F.get_json_object("first.detail", "$.dlqId")).alias("requeued_from"),
        )
    )


def work_reports(events: DataFrame, dispatched_entries: DataFrame) -> DataFrame:
    """Every WORK_* report, with the issue of its dispatch when the report names none.

    `worker` is the reporting consumer, else its agent. Columns: id, occurred_at, kind, stream,
    entry_id, issue_id, worker, consumer, agent_id, attempt, fenced.
    """
    issues = dispatched_entries.select(*ENTRY, F.col("issue_id").alias("dispatched_issue"))
    reports = events.where(
        F.col("kind").isin(*WORK_KINDS)
        & F.col("stream").isNotNull()
        & F.col("entry_id").isNotNull()
    )
    return reports.join(issues, ENTRY, "left").select(
        "id",
        "occurred_at",
        "kind",
        *ENTRY,
        F.coalesce("issue_id", "dispatched_issue").alias("issue_id"),
        F.coalesce("consumer", "agent_id").alias("worker"),
        "consumer",
        "agent_id",
        "attempt",
        "fenced",
    )


def completions(reports: DataFrame) -> DataFrame:
    """Accepted completions. A fenced (409) WORK_COMPLETED came from an outdated attempt and was
    refused: it does not complete anything."""
    return reports.where((F.col("kind") == WORK_COMPLETED) & ~F.col("fenced"))


def dead_letters(events: DataFrame, queue: DataFrame) -> DataFrame:
    """Dead-lettered entries, one row each, from both places they are recorded.

    DEAD_LETTERED rows are the reaper's; `<stream>:dlq` also holds the letters the agent runtime
    writes straight to Redis, which never reach the log. A letter's time is its DLQ id's.
    Columns: stream, entry_id, issue_id, dead_lettered_at, sources, dlq_id, reason, deliveries.
    """
    logged = per_entry(events.where(F.col("kind") == DEAD_LETTERED)).select(
        *ENTRY,
        "issue_id",
        F.col("occurred_at").alias("at"),
        _json("dlqId").alias("dlq_id"),
        _json("reason").alias("reason"),
        _json("deliveries").try_cast("int").alias("deliveries"),
        F.lit("event-log").alias("source"),
    )
    queued = queue.where(F.col("original_id").isNotNull()).select(
        "stream",
        F.col("original_id").alias("entry_id"),
        "issue_id",
        F.timestamp_millis(stream_id_ms("dlq_id")).alias("at"),
        "dlq_id",
        "reason",
        "deliveries",
        F.lit("dlq").alias("source"),
    )
    return (
        logged.unionByName(queued)
        .where(F.col("stream").isNotNull() & F.col("entry_id").isNotNull())
        .groupBy(*ENTRY)
        .agg(
            F.max("issue_id").alias("issue_id"),
            F.min("at").alias("dead_lettered_at"),
            F.array_sort(F.collect_set("source")).alias("sources"),
            F.max("dlq_id").alias("dlq_id"),
            F.max("reason").alias("reason"),
            F.max("deliveries").alias("deliveries"),
        )
    )


def unmatched_requeues(events: DataFrame) -> DataFrame:
    """Requeues of letters with no DEAD_LETTERED row: letters the agent runtime wrote.

    Requeuing deletes the letter from the DLQ, so for these the requeue is the only trace left
    that the original entry was dead-lettered. Columns: stream, issue_id, requeue_event_id,
    requeued_at, dlq_id.
    """
    requeues = events.where(F.col("kind") == DEAD_LETTER_REQUEUED).select(
        "stream",
        "issue_id",
        F.col("id").alias("requeue_event_id"),
        F.col("occurred_at").alias("requeued_at"),
        _json("dlqId").alias("dlq_id"),
    )
    logged = (
        per_entry(events.where(F.col("kind") == DEAD_LETTERED))
        .select("stream", _json("dlqId").alias("dlq_id"))
        .where(F.col("dlq_id").isNotNull())
    )
    return requeues.join(logged, ["stream", "dlq_id"], "left_anti")


def entry_status(
    dispatched_entries: DataFrame,
    reports: DataFrame,
    dead: DataFrame,
    pending: DataFrame,
    requeues: DataFrame,
) -> DataFrame:
    """The status of every dispatched entry, with the evidence behind it.

    `pending` is the Redis snapshot (PENDING_SCHEMA); `requeues` is `unmatched_requeues(...)`.
    Columns: the `dispatched` ones, status, completed_at, completed_by, dead_lettered_at,
    dead_letter_sources, pending_states, pending_groups, pending_consumers, reports, attempts,
    fenced_reports, last_report_kind, last_report_by, last_report_at, finished_at.
    """
    accepted = (F.col("kind") == WORK_COMPLETED) & ~F.col("fenced")  # as `completions`
    # One pass over the reports: completion and activity together (one shuffle, one join).
    activity = reports.groupBy(*ENTRY).agg(
        F.min(F.when(accepted, F.col("occurred_at"))).alias("completed_at"),
        F.array_sort(F.collect_set(F.when(accepted, F.col("worker")))).alias("completed_by"),
        F.count(F.lit(1)).alias("reports"),
        F.max("attempt").alias("attempts"),
        F.count_if(F.col("fenced")).alias("fenced_reports"),
        F.max_by(F.struct("kind", "worker", "occurred_at"), "id").alias("last"),
    )
    held = pending.groupBy(*ENTRY).agg(
        F.array_sort(F.collect_set("state")).alias("pending_states"),
        F.array_sort(F.collect_set("group_name")).alias("pending_groups"),
        F.array_sort(F.collect_set("consumer")).alias("pending_consumers"),
    )
    lettered = dead.select(
        *ENTRY, "dead_lettered_at", F.col("sources").alias("dead_letter_sources")
    )
    joined = (
        dispatched_entries.join(activity, ENTRY, "left")
        .join(lettered, ENTRY, "left")
        .join(held, ENTRY, "left")
    )
    status = (
        F.when(F.col("completed_at").isNotNull(), F.lit(COMPLETED))
        .when(F.col("dead_lettered_at").isNotNull(), F.lit(DEAD))
        .when(F.col("pending_states").isNotNull(), F.lit(PENDING))
        .otherwise(F.lit(LOST))
    )
    judged = _requeued_letters(joined.withColumn("status", status), requeues)
    return judged.select(
        *ENTRY,
        "issue_id",
        "agent_id",
        "dispatched_at",
        "dispatch_event_id",
        "origin",
        "requeued_from",
        "status",
        "completed_at",
        F.when(F.col("completed_at").isNotNull(), F.col("completed_by")).alias("completed_by"),
        "dead_lettered_at",
        "dead_letter_sources",
        "pending_states",
        "pending_groups",
        "pending_consumers",
        F.coalesce("reports", F.lit(0)).alias("reports"),
        "attempts",
        F.coalesce("fenced_reports", F.lit(0)).alias("fenced_reports"),
        F.col("last.kind").alias("last_report_kind"),
        F.col("last.worker").alias("last_report_by"),
        F.col("last.occurred_at").alias("last_report_at"),
        F.coalesce("completed_at", "dead_lettered_at").alias("finished_at"),
    )


def _requeued_letters(judged: DataFrame, requeues: DataFrame) -> DataFrame:
    """Entries that look lost but whose letter was requeued: dead-lettered after all.

    Within one (stream, issue), the n-th such entry by dispatch order is matched with the n-th
    unmatched requeue, provided it was dispatched before that requeue. The entry a requeue
    created is never its own original: its dispatch is the requeue itself.
    """
    by_issue = ["stream", "issue_id"]
    candidates = judged.where((F.col("status") == LOST) & F.col("issue_id").isNotNull()).select(
        *ENTRY,
        "issue_id",
        "dispatch_event_id",
        F.row_number()
        .over(Window.partitionBy(*by_issue).orderBy("dispatch_event_id"))
        .alias("rank"),
    )
    ranked = requeues.where(F.col("issue_id").isNotNull()).select(
        *by_issue,
        "requeue_event_id",
        "requeued_at",
        F.row_number()
        .over(Window.partitionBy(*by_issue).orderBy("requeue_event_id"))
        .alias("rank"),
    )
    matched = (
        candidates.join(ranked, [*by_issue, "rank"])
        .where(F.col("dispatch_event_id") < F.col("requeue_event_id"))
        .select(*ENTRY, F.col("requeued_at").alias("inferred_dead_at"))
    )
    inferred = F.col("inferred_dead_at").isNotNull()
    return (
        judged.join(matched, ENTRY, "left")
        .withColumn("status", F.when(inferred, F.lit(DEAD)).otherwise(F.col("status")))
        .withColumn("dead_lettered_at", F.coalesce("dead_lettered_at", "inferred_dead_at"))
        .withColumn(
            "dead_letter_sources",
            F.when(inferred, F.array(F.lit("requeue"))).otherwise(F.col("dead_letter_sources")),
        )
        .drop("inferred_dead_at")
    )


def lost(status: DataFrame) -> DataFrame:
    """Dispatched, never completed, not dead-lettered and no longer pending."""
    return (
        status.where(F.col("status") == LOST)
        .select(
            *ENTRY,
            "issue_id",
            "agent_id",
            "dispatched_at",
            "origin",
            "reports",
            "attempts",
            "last_report_kind",
            "last_report_by",
            "last_report_at",
        )
        .orderBy(*entry_order())
    )


def overlapping_attempts(reports: DataFrame) -> DataFrame:
    """Reports of an older attempt, fenced or not, made after a newer attempt had started.

    "After" is event-log order (the id), which for one entry is the order in which its
    conditional updates committed. Each such report is paired with the first newer start it
    followed. Columns: stream, entry_id, issue_id, older_event_id, older_kind, older_worker,
    older_attempt, older_fenced, older_reported_at, newer_attempt, newer_worker, newer_started_at.
    """
    starts = reports.where(
        (F.col("kind") == WORK_STARTED) & ~F.col("fenced") & F.col("attempt").isNotNull()
    ).select(
        *ENTRY,
        F.col("id").alias("newer_id"),
        F.col("attempt").alias("newer_attempt"),
        F.col("worker").alias("newer_worker"),
        F.col("occurred_at").alias("newer_started_at"),
    )
    older = reports.where(F.col("attempt").isNotNull())
    pairs = older.join(starts, ENTRY).where(
        (F.col("newer_attempt") > F.col("attempt")) & (F.col("newer_id") < F.col("id"))
    )
    first_newer = F.min_by(
        F.struct("newer_attempt", "newer_worker", "newer_started_at"), "newer_id"
    ).alias("newer")
    return (
        pairs.groupBy(
            "id", *ENTRY, "issue_id", "kind", "worker", "attempt", "fenced", "occurred_at"
        )
        .agg(first_newer)
        .select(
            *ENTRY,
            "issue_id",
            F.col("id").alias("older_event_id"),
            F.col("kind").alias("older_kind"),
            F.col("worker").alias("older_worker"),
            F.col("attempt").alias("older_attempt"),
            F.col("fenced").alias("older_fenced"),
            F.col("occurred_at").alias("older_reported_at"),
            F.col("newer.newer_attempt").alias("newer_attempt"),
            F.col("newer.newer_worker").alias("newer_worker"),
            F.col("newer.newer_started_at").alias("newer_started_at"),
        )
    )


def _issue_key(prefix: str = "") -> Column:
    """Groups by issue; a report with no known issue stands for its entry alone."""
    return F.coalesce(
        F.col(f"{prefix}issue_id"),
        F.concat(F.lit("entry:"), F.col(f"{prefix}stream"), F.lit("/"), F.col(f"{prefix}entry_id")),
    )


def duplicates(reports: DataFrame, overlaps: DataFrame) -> DataFrame:
    """Issues worked twice: completed (accepted) by more than one consumer, or with two attempts
    running at once (`overlapping_attempts`).

    Columns: issue_id, consumers (sorted), reasons, entries (stream, entry_id).
    """
    entry = F.struct(*ENTRY)
    done = completions(reports).withColumn("issue_key", _issue_key())
    # Cheap first: the few issues whose completions name more than one worker...
    several = (
        done.groupBy("issue_key")
        .agg(F.min("worker").alias("first"), F.max("worker").alias("last"))
        .where(F.col("first") != F.col("last"))
        .select("issue_key")
    )
    # ...then the details for those only.
    by_consumers = (
        done.join(several, "issue_key")
        .groupBy("issue_key")
        .agg(
            F.max("issue_id").alias("issue_id"),
            F.array_sort(F.collect_set("worker")).alias("consumers"),
            F.collect_set(entry).alias("entries"),
        )
        .withColumn("reason", F.lit(BY_SEVERAL_CONSUMERS))
    )
    overlapping = overlaps.select(
        _issue_key().alias("issue_key"),
        "issue_id",
        F.array_compact(F.array("older_worker", "newer_worker")).alias("consumers"),
        F.array(entry).alias("entries"),
        F.lit(OVERLAPPING_ATTEMPTS).alias("reason"),
    )
    return (
        by_consumers.unionByName(overlapping)
        .groupBy("issue_key")
        .agg(
            F.max("issue_id").alias("issue_id"),
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("consumers")))).alias(
                "consumers"
            ),
            F.array_sort(F.collect_set("reason")).alias("reasons"),
            F.array_sort(F.array_distinct(F.flatten(F.collect_list("entries")))).alias("entries"),
        )
        .orderBy("issue_key")
        .drop("issue_key")
    )


def reclaims(events: DataFrame) -> DataFrame:
    """One row per reclaimed entry, batches unrolled, with its latency: the reclaim's time minus
    the old owner's newest heartbeat (`lastHeartbeatAt`; NULL when it never sent one).

    Columns: event_id, reclaimed_at, stream, group_name, entry_id, from_consumer, from_agent,
    to_consumer, to_agent, reason, reasons (JSON), idle_ms, deliveries, last_heartbeat_at,
    latency_ms. `reason` is the move's (pod-gone, down, degraded, stalled, manual); rows written
    before reasons existed say `pod-gone` when the pod was gone, else `down`.
    """
    heartbeat = F.try_to_timestamp(_json("lastHeartbeatAt"))
    reason = F.coalesce(
        _json("reason"),
        F.when(F.instr(F.coalesce(_json("reasons"), F.lit("")), '"pod-gone"') > 0, "pod-gone"),
        F.lit("down"),
    )
    return per_entry(events.where(F.col("kind") == RECLAIMED)).select(
        F.col("id").alias("event_id"),
        F.col("occurred_at").alias("reclaimed_at"),
        "stream",
        "group_name",
        "entry_id",
        F.col("consumer").alias("from_consumer"),
        F.col("agent_id").alias("from_agent"),
        _json("toConsumer").alias("to_consumer"),
        _json("toAgent").alias("to_agent"),
        reason.alias("reason"),
        _json("reasons").alias("reasons"),
        _json("idleMs").try_cast("long").alias("idle_ms"),
        _json("deliveries").try_cast("int").alias("deliveries"),
        heartbeat.alias("last_heartbeat_at"),
        _millis_between(F.col("occurred_at"), heartbeat).alias("latency_ms"),
    )


def reclaims_by_reason(reclaimed: DataFrame) -> DataFrame:
    """Reclaimed entries per reason: reason, reclaims."""
    return reclaimed.groupBy("reason").agg(F.count(F.lit(1)).alias("reclaims")).orderBy("reason")


def reclaim_latency(reclaimed: DataFrame) -> DataFrame:
    """One row: reclaims, measured (with a heartbeat to measure from), p50, p95, max (ms).

    Exact percentiles with linear interpolation between the closest ranks; NULL when nothing
    was measured.
    """
    quantiles = F.percentile("latency_ms", [0.5, 0.95])
    return reclaimed.agg(
        F.count(F.lit(1)).alias("reclaims"),
        F.count("latency_ms").alias("measured"),
        quantiles.alias("q"),
        F.max("latency_ms").alias("max"),
    ).select(
        "reclaims",
        "measured",
        F.col("q")[0].alias("p50"),
        F.col("q")[1].alias("p95"),
        "max",
    )


def latency_histogram(reclaimed: DataFrame, bins: int = 40) -> DataFrame:
    """`bins` equal-width bins over the measured latencies: bin, bin_start_ms, bin_end_ms, count."""
    measured = reclaimed.where(F.col("latency_ms").isNotNull()).select("latency_ms")
    bounds = measured.agg(F.min("latency_ms").alias("lo"), F.max("latency_ms").alias("hi"))
    width = F.greatest((F.col("hi") - F.col("lo")) / F.lit(float(bins)), F.lit(1.0))
    binned = measured.crossJoin(bounds).select(
        F.least(F.floor((F.col("latency_ms") - F.col("lo")) / width), F.lit(bins - 1)).alias("bin"),
        F.col("lo"),
        width.alias("width"),
    )
    return (
        binned.groupBy("bin", "lo", "width")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(
            "bin",
            (F.col("lo") + F.col("bin") * F.col("width")).alias("bin_start_ms"),
            (F.col("lo") + (F.col("bin") + 1) * F.col("width")).alias("bin_end_ms"),
            "count",
        )
        .orderBy("bin")
    )


def heartbeat_gaps(events: DataFrame, *, window_end: datetime) -> DataFrame:
    """Per agent, the gap after each heartbeat: to the next one, or to `window_end` for the last.

    Columns: agent_id, gap_start, gap_end, gap_ms, open_ended (the gap after the newest beat).
    """
    end = F.lit(window_end).cast(TimestampType())
    beats = events.where(
        (F.col("kind") == HEARTBEAT) & F.col("agent_id").isNotNull() & (F.col("occurred_at") <= end)
    )
    following = F.lead("occurred_at").over(
        Window.partitionBy("agent_id").orderBy("occurred_at", "id")
    )
    return beats.select(
        "agent_id",
        F.col("occurred_at").alias("gap_start"),
        F.coalesce(following, end).alias("gap_end"),
        following.isNull().alias("open_ended"),
    ).withColumn(
        "gap_ms", F.greatest(_millis_between(F.col("gap_end"), F.col("gap_start")), F.lit(0.0))
    )


def availability(gaps: DataFrame, *, down_ms: int) -> DataFrame:
    """Per agent, from its first heartbeat to the window's end: a gap longer than `down_ms`
    counts as down time, the whole gap (the agent stopped at its last beat); `detected_down_ms`
    is the part the conductor saw as down (the gap beyond the threshold).

    Columns: agent_id, first_heartbeat, last_heartbeat, heartbeats, observed_ms, down_ms,
    detected_down_ms, down_periods, down_at_end, availability (1.0 when nothing was observed).
    """
    down = F.col("gap_ms") > F.lit(float(down_ms))
    return (
        gaps.groupBy("agent_id")
        .agg(
            F.min("gap_start").alias("first_heartbeat"),
            F.max("gap_start").alias("last_heartbeat"),
            F.count(F.lit(1)).alias("heartbeats"),
            F.sum("gap_ms").alias("observed_ms"),
            F.sum(F.when(down, F.col("gap_ms")).otherwise(F.lit(0.0))).alias("down_ms"),
            F.sum(
                F.when(down, F.col("gap_ms") - F.lit(float(down_ms))).otherwise(F.lit(0.0))
            ).alias("detected_down_ms"),
            F.count_if(down).alias("down_periods"),
            F.bool_or(down & F.col("open_ended")).alias("down_at_end"),
        )
        .withColumn(
            "availability",
            F.when(
                F.col("observed_ms") > 0, F.lit(1.0) - F.col("down_ms") / F.col("observed_ms")
            ).otherwise(F.lit(1.0)),
        )
        .orderBy("availability", "agent_id")
    )


def down_periods(gaps: DataFrame, *, down_ms: int) -> DataFrame:
    """The gaps that count as down time: agent_id, down_from (the last beat before), down_until,
    duration_ms, still_down (no heartbeat since, at the window's end)."""
    return (
        gaps.where(F.col("gap_ms") > F.lit(float(down_ms)))
        .select(
            "agent_id",
            F.col("gap_start").alias("down_from"),
            F.col("gap_end").alias("down_until"),
            F.col("gap_ms").alias("duration_ms"),
            F.col("open_ended").alias("still_down"),
        )
        .orderBy("agent_id", "down_from")
    )


def _count(status: str) -> Column:
    return F.count_if(F.col("status") == status)


def dead_letter_rate(status: DataFrame) -> DataFrame:
    """Per stream: dispatched, completed, dead_lettered, pending, lost, dead_letter_rate."""
    return (
        status.groupBy("stream")
        .agg(
            F.count(F.lit(1)).alias("dispatched"),
            _count(COMPLETED).alias("completed"),
            _count(DEAD).alias("dead_lettered"),
            _count(PENDING).alias("pending"),
            _count(LOST).alias("lost"),
        )
        .withColumn(
            "dead_letter_rate",
            F.try_divide(F.col("dead_lettered").cast("double"), F.col("dispatched")),
        )
        .orderBy("stream")
    )


def totals(status: DataFrame) -> DataFrame:
    """One row of counts over distinct dispatched entries (the statuses partition them)."""
    in_pel = F.array_contains(F.col("pending_states"), IN_PEL)
    return status.agg(
        F.count(F.lit(1)).alias("dispatched"),
        F.count_if(F.col("origin") == "requeued").alias("requeued"),
        _count(COMPLETED).alias("completed"),
        _count(DEAD).alias("dead_lettered"),
        _count(PENDING).alias("pending"),
        _count(LOST).alias("lost"),
        F.count_if((F.col("status") == PENDING) & in_pel).alias("pending_in_pel"),
        F.count_if((F.col("status") == PENDING) & ~in_pel).alias("pending_undelivered"),
        F.count_if(
            (F.col("status") == DEAD) & F.array_contains("dead_letter_sources", "event-log")
        ).alias("dead_lettered_logged"),
        F.count_if(
            (F.col("status") == DEAD) & ~F.array_contains("dead_letter_sources", "event-log")
        ).alias("dead_lettered_outside_log"),
        F.count_if((F.col("status") == COMPLETED) & F.col("pending_states").isNotNull()).alias(
            "completed_still_pending"
        ),
    )


def pending_over_time(status: DataFrame, *, bucket_ms: int) -> DataFrame:
    """Dispatched minus finished (completed or dead-lettered) over time, per `bucket_ms` bucket.

    Columns: bucket_start, dispatched, finished, outstanding (running total at the bucket's end).
    """

    def bucket(column: str) -> Column:
        millis = F.unix_millis(F.col(column))
        return (millis - F.pmod(millis, F.lit(bucket_ms))).alias("bucket")

    starts = status.select(bucket("dispatched_at"), F.lit(1).alias("d"), F.lit(0).alias("f"))
    ends = status.where(F.col("finished_at").isNotNull()).select(
        bucket("finished_at"), F.lit(0).alias("d"), F.lit(1).alias("f")
    )
    flows = (
        starts.unionByName(ends)
        .groupBy("bucket")
        .agg(F.sum("d").alias("dispatched"), F.sum("f").alias("finished"))
    )
    # The running total over a few hundred buckets, in one row: sorted into an array, each
    # position summing the flows up to it. (A window without a partition would do the same
    # with a warning on every run.)
    series = flows.agg(
        F.array_sort(F.collect_list(F.struct("bucket", "dispatched", "finished"))).alias("s")
    )
    return (
        series.select("s", F.posexplode("s").alias("i", "b"))
        .select(
            F.timestamp_millis(F.col("b.bucket")).alias("bucket_start"),
            F.col("b.dispatched").alias("dispatched"),
            F.col("b.finished").alias("finished"),
            F.aggregate(
                F.slice("s", F.lit(1), F.col("i") + 1),
                F.lit(0).cast("long"),
                lambda total, b: total + b["dispatched"] - b["finished"],
            ).alias("outstanding"),
        )
        .orderBy("bucket_start")
    )


def detector_sightings(events: DataFrame) -> DataFrame:
    """The detector's CONSUMER_WITHOUT_HEARTBEAT sightings per consumer (informational)."""
    return (
        events.where(F.col("kind") == CONSUMER_WITHOUT_HEARTBEAT)
        .groupBy("stream", "group_name", "consumer", "agent_id")
        .agg(
            F.count(F.lit(1)).alias("sightings"),
            F.min("occurred_at").alias("first_seen"),
            F.max("occurred_at").alias("last_seen"),
        )
        .orderBy("stream", "group_name", "consumer")
    )


_BUCKETS_MS = (
    1_000,
    5_000,
    10_000,
    30_000,
    60_000,
    300_000,
    900_000,
    1_800_000,
    3_600_000,
    3 * 3_600_000,
    6 * 3_600_000,
    12 * 3_600_000,
    86_400_000,
    7 * 86_400_000,
)


def choose_bucket_ms(span_ms: float, *, points: int = 120) -> int:
    """The smallest round bucket that draws `span_ms` in at most `points` buckets."""
    for step in _BUCKETS_MS:
        if span_ms / step <= points:
            return step
    return _BUCKETS_MS[-1]
