"""The audit's rules as pure DataFrame transforms: event log and Redis snapshot in, findings out.

No I/O and no clock: frames come in (rows of `events`, the pending entries and dead letters that
Redis held when it was read) and lazy frames go out. `job` reads the sources, passes the instant
the window ends and the thresholds, and writes the results. Every function here runs on small
hand-built frames in the unit tests.

An entry is `(stream, entry_id)`. Each dispatched entry ends in exactly one status, checked in
this order: completed (an accepted, non-fenced WORK_COMPLETED whose staged outputs, if it named
any, were published), dead-lettered (a DEAD_LETTERED
row, a letter in `<stream>:dlq`, or a requeue of a letter that never reached the log), pending
(in a pending entries list, or not yet delivered to a group), else lost.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from rig_conductor.audit.vocabulary import (
    COMPLETED,
    DEAD,
    DEAD_LETTER_REQUEUED,
    DEAD_LETTERED,
    ENTRY,
    ISSUE_ASSIGNED,
    LOST,
    PENDING,
    WORK_COMPLETED,
    WORK_KINDS,
    WORK_PUBLISHED,
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


def millis_between(later: Column, earlier: Column) -> Column:
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1000.0)


def json_field(field: str) -> Column:
    return F.get_json_object(F.col("detail"), f"$.{field}")


def per_entry(events: DataFrame) -> DataFrame:
    """Rows about several entries at once (`entry_ids`) as one row per entry; drops `entry_ids`."""
    single = events.where(F.col("entry_ids").isNull()).drop("entry_ids")
    several = events.where(F.col("entry_ids").isNotNull()).withColumn(
        "entry_id", F.explode("entry_ids")
    )
    return single.unionByName(several.drop("entry_ids"))


DISPATCH_COLUMNS = (
    *ENTRY,
    "issue_id",
    "agent_id",
    "dispatched_at",
    "dispatch_event_id",
    "origin",
    "requeued_from",
)


def replaced_dispatches(events: DataFrame) -> DataFrame:
    """Entries a later ISSUE_ASSIGNED `replaces`: Redis lost them (a failover before anyone
    started them, or all of its data, started or not) and the conductor appended the dispatch
    again. The lost entry was fenced off first (`superseded`): a holder's late reports on it are
    fenced and count for nothing; the replacement carries the issue. Columns: stream,
    entry_id. Few rows."""
    return (
        # A cheap look for the key before the JSON is parsed: few dispatches replace another.
        events.where(
            (F.col("kind") == ISSUE_ASSIGNED)
            & F.col("stream").isNotNull()
            & F.col("detail").contains('"replaces"')
        )
        .select("stream", json_field("replaces").alias("entry_id"))
        .where(F.col("entry_id").isNotNull())
    )


def unpublished_completions(events: DataFrame) -> DataFrame:
    """Accepted completions that named staged outputs which were never published: no
    WORK_PUBLISHED of that attempt, or one that found them missing (the completion was voided
    and the entry ran again). Nothing is claimed for them: they do not complete their entry.
    Columns: stream, entry_id, attempt. Few rows."""
    key = [*ENTRY, "attempt"]
    staged = events.where(
        (F.col("kind") == WORK_COMPLETED)
        & ~F.col("fenced")
        & (F.coalesce(json_field("outputs").cast("int"), F.lit(0)) > 0)
    ).select(*key)
    published = events.where(
        (F.col("kind") == WORK_PUBLISHED)
        & ~F.col("fenced")
        & F.coalesce(~F.col("detail").contains('"missing"'), F.lit(True))
    ).select(*key)
    return staged.join(published, key, "left_anti").distinct()


def _with_void(rows: DataFrame, unpublished: DataFrame) -> DataFrame:
    """`rows` with `void`: true for a completion in `unpublished` (few rows: broadcast)."""
    flagged = unpublished.withColumn("void", F.lit(True))
    joined = rows.join(F.broadcast(flagged), [*ENTRY, "attempt"], "left")
    return joined.withColumn("void", F.coalesce(F.col("void"), F.lit(False)))


def entry_facts(
    events: DataFrame, replaced: DataFrame, unpublished: DataFrame | None = None
) -> DataFrame:
    """One row per dispatched entry: its dispatch and what its reports say, in one pass.

    Dispatches are ISSUE_ASSIGNED rows, and DEAD_LETTER_REQUEUED rows: a dead letter put back on
    its stream is a new entry (with the same issue) that has to be worked like any other. The
    first dispatch of an entry counts. An entry in `replaced` (`replaced_dispatches`) is not
    counted: its replacement is. The dispatch rows and the WORK_* reports meet in one grouping
    by entry, so the log is shuffled once for both.

    Columns: DISPATCH_COLUMNS (origin `assigned` / `requeued`; requeued_from the DLQ id a
    requeued entry came from), completed_at, completed_by, reports, attempts (the newest
    reported), first_attempt (the oldest), fenced_reports, last (kind, worker, occurred_at of
    the newest report); the report columns are NULL for an entry nobody reported on.
    """
    dispatch = F.col("kind").isin(ISSUE_ASSIGNED, DEAD_LETTER_REQUEUED)
    report = F.col("kind").isin(*WORK_KINDS)
    # As `completions`: not fenced, and published when it staged outputs.
    accepted = (F.col("kind") == WORK_COMPLETED) & ~F.col("fenced") & ~F.col("void")
    if unpublished is None:
        unpublished = unpublished_completions(events)
    rows = _with_void(_entry_rows(events.where(dispatch | report), replaced), unpublished)
    first = F.min_by(
        F.struct("id", "kind", "issue_id", "agent_id", "occurred_at", "dlq_id"),
        F.when(dispatch, F.col("id")),
    )
    requeued = F.col("first.kind") == DEAD_LETTER_REQUEUED
    return (
        # Hashed by entry first: an entry's rows are spread over the whole log, so a partial
        # aggregation before the shuffle would sort every row and merge next to nothing.
        rows.repartition(*ENTRY)
        .groupBy(*ENTRY)
        .agg(
            first.alias("first"),
            F.max(F.when(dispatch, F.col("issue_id"))).alias("any_issue"),
            F.min(F.when(accepted, F.col("occurred_at"))).alias("completed_at"),
            F.array_sort(F.collect_set(F.when(accepted, F.col("worker")))).alias("completed_by"),
            F.count_if(report).alias("reports"),
            F.max(F.when(report, F.col("attempt"))).alias("attempts"),
            F.min(F.when(report, F.col("attempt"))).alias("first_attempt"),
            F.count_if(report & F.col("fenced")).alias("fenced_reports"),
            F.max_by(F.struct("kind", "worker", "occurred_at"), F.when(report, F.col("id"))).alias(
                "last"
            ),
        )
        .where(F.col("first").isNotNull())
        .select(
            *ENTRY,
            F.coalesce("first.issue_id", "any_issue").alias("issue_id"),
            F.col("first.agent_id").alias("agent_id"),
            F.col("first.occurred_at").alias("dispatched_at"),
            F.col("first.id").alias("dispatch_event_id"),
            F.when(requeued, F.lit("requeued")).otherwise(F.lit("assigned")).alias("origin"),
            F.when(requeued, F.col("first.dlq_id")).alias("requeued_from"),
            "completed_at",
            "completed_by",
            "reports",
            "attempts",
            "first_attempt",
            "fenced_reports",
            "last",
        )
    )


def _entry_rows(events: DataFrame, replaced: DataFrame) -> DataFrame:
    """The columns `entry_facts` groups, of the rows that name an entry not replaced."""
    return (
        events.where(F.col("stream").isNotNull() & F.col("entry_id").isNotNull())
        .join(replaced, ENTRY, "left_anti")
        .select(
            *ENTRY,
            "id",
            "kind",
            "issue_id",
            "agent_id",
            "occurred_at",
            F.coalesce("consumer", "agent_id").alias("worker"),
            "attempt",
            "fenced",
            # The dispatch's fields can be large: only a requeue's DLQ id is shuffled.
            F.when(F.col("kind") == DEAD_LETTER_REQUEUED, json_field("dlqId")).alias("dlq_id"),
        )
    )


def reattempted(facts: DataFrame) -> DataFrame:
    """Entries reported on under more than one attempt: the only ones where an older attempt
    can overlap a newer (`duplicates.overlapping_attempts`). Columns: stream, entry_id."""
    return facts.where(F.col("attempts") > F.col("first_attempt")).select(*ENTRY)


def work_reports(
    events: DataFrame, dispatched_entries: DataFrame, unpublished: DataFrame | None = None
) -> DataFrame:
    """Every WORK_* report, with the issue of its dispatch when the report names none.

    `worker` is the reporting consumer, else its agent; `work_group` the group it reported for
    ("" before groups were named); `void` marks a completion whose staged outputs were never
    published (`unpublished_completions`). Columns: id, occurred_at, kind, stream, entry_id,
    issue_id, worker, consumer, agent_id, attempt, fenced, work_group, void.
    """
    if unpublished is None:
        unpublished = unpublished_completions(events)
    reports = events.where(
        F.col("kind").isin(*WORK_KINDS)
        & F.col("stream").isNotNull()
        & F.col("entry_id").isNotNull()
    )
    # Agents name the issue in nearly every report: only the rest are joined with the
    # dispatches (the join that shuffled every report before).
    named = reports.where(F.col("issue_id").isNotNull())
    unnamed = (
        reports.where(F.col("issue_id").isNull())
        .drop("issue_id")
        .join(dispatched_entries.select(*ENTRY, "issue_id"), ENTRY, "left")
    )
    reported = named.unionByName(unnamed).select(
        "id",
        "occurred_at",
        "kind",
        *ENTRY,
        "issue_id",
        F.coalesce("consumer", "agent_id").alias("worker"),
        "consumer",
        "agent_id",
        "attempt",
        "fenced",
        # Work is owned per group: attempts and completions are compared within one. Reports of
        # agents that named no group (before 0.2) share the group "".
        F.coalesce("group_name", F.lit("")).alias("work_group"),
    )
    return _with_void(reported, unpublished)


def completions(reports: DataFrame) -> DataFrame:
    """Accepted completions. A fenced (409) WORK_COMPLETED came from an outdated attempt and was
    refused, and one whose staged outputs were never published claims nothing (`void`):
    neither completes anything."""
    return reports.where((F.col("kind") == WORK_COMPLETED) & ~F.col("fenced") & ~F.col("void"))


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
        json_field("dlqId").alias("dlq_id"),
        json_field("reason").alias("reason"),
        json_field("deliveries").try_cast("int").alias("deliveries"),
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
        json_field("dlqId").alias("dlq_id"),
    )
    logged = (
        per_entry(events.where(F.col("kind") == DEAD_LETTERED))
        .select("stream", json_field("dlqId").alias("dlq_id"))
        .where(F.col("dlq_id").isNotNull())
    )
    return requeues.join(logged, ["stream", "dlq_id"], "left_anti")


def _judged_entries(facts: DataFrame, dead: DataFrame, pending: DataFrame) -> DataFrame:
    """Every dispatched entry's status from its own evidence (before `_requeued_letters`).

    `facts` is `entry_facts(...)`, `dead` is `dead_letters(...)`, `pending` the Redis snapshot
    (PENDING_SCHEMA). Columns: DISPATCH_COLUMNS, status, completed_at, completed_by,
    dead_lettered_at, dead_letter_sources, pending_states, pending_groups, pending_consumers,
    reports, attempts, fenced_reports, last_report_kind, last_report_by, last_report_at,
    finished_at.
    """
    pending_by_entry = pending.groupBy(*ENTRY).agg(
        F.array_sort(F.collect_set("state")).alias("pending_states"),
        F.array_sort(F.collect_set("group_name")).alias("pending_groups"),
        F.array_sort(F.collect_set("consumer")).alias("pending_consumers"),
    )
    lettered = dead.select(
        *ENTRY, "dead_lettered_at", F.col("sources").alias("dead_letter_sources")
    )
    joined = facts.join(lettered, ENTRY, "left").join(pending_by_entry, ENTRY, "left")
    status = (
        F.when(F.col("completed_at").isNotNull(), F.lit(COMPLETED))
        .when(F.col("dead_lettered_at").isNotNull(), F.lit(DEAD))
        .when(F.col("pending_states").isNotNull(), F.lit(PENDING))
        .otherwise(F.lit(LOST))
    )
    return _entry_columns(joined.withColumn("status", status))


def entry_status(
    facts: DataFrame,
    dead: DataFrame,
    pending: DataFrame,
    requeues: DataFrame,
    *,
    broadcast_matches: bool = False,
) -> DataFrame:
    """The status of every dispatched entry, with the evidence behind it: `_judged_entries`,
    corrected by `_requeued_letters`. `requeues` is `unmatched_requeues(...)`.

    `_requeued_letters` finds at most one entry per requeue: when the caller knows the requeues
    are few, `broadcast_matches` sends those entries whole to every task, so the large side of
    the last join is not shuffled again.
    """
    judged = _judged_entries(facts, dead, pending)
    matched = _requeued_letters(judged, requeues)
    return _with_requeued_letters(judged, F.broadcast(matched) if broadcast_matches else matched)


def _entry_columns(judged: DataFrame) -> DataFrame:
    return judged.select(
        *DISPATCH_COLUMNS,
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
    Columns: stream, entry_id, inferred_dead_at. As few rows as such requeues.
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
    return (
        candidates.join(ranked, [*by_issue, "rank"])
        .where(F.col("dispatch_event_id") < F.col("requeue_event_id"))
        .select(*ENTRY, F.col("requeued_at").alias("inferred_dead_at"))
    )


def _with_requeued_letters(judged: DataFrame, matched: DataFrame) -> DataFrame:
    """`judged` with the entries `_requeued_letters` matched marked dead-lettered."""
    inferred = F.col("inferred_dead_at").isNotNull()
    return (
        judged.join(matched, ENTRY, "left")
        .withColumn("status", F.when(inferred, F.lit(DEAD)).otherwise(F.col("status")))
        .withColumn("dead_lettered_at", F.coalesce("dead_lettered_at", "inferred_dead_at"))
        .withColumn(
            "dead_letter_sources",
            F.when(inferred, F.array(F.lit("requeue"))).otherwise(F.col("dead_letter_sources")),
        )
        .withColumn("finished_at", F.coalesce("finished_at", "inferred_dead_at"))
        .drop("inferred_dead_at")
    )
