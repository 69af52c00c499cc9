"""Work done twice, pure DataFrame transforms: an issue completed by several consumers, or an
older attempt reporting after a newer one started."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rig_conductor.audit.reconcile import completions
from rig_conductor.audit.vocabulary import (
    BY_SEVERAL_CONSUMERS,
    ENTRY,
    OVERLAPPING_ATTEMPTS,
    WORK_STARTED,
)


def overlapping_attempts(reports: DataFrame, reattempted: DataFrame) -> DataFrame:
    """Reports of an older attempt, fenced or not, made after a newer attempt had started.

    "After" is event-log order (the id), which for one entry is the order in which its
    conditional updates committed. Each such report is paired with the first newer start it
    followed. Only the entries in `reattempted` (`reconcile.reattempted`: reported on under
    more than one attempt) can hold one, so only their reports are paired.
    Columns: stream, entry_id, issue_id, older_event_id, older_kind, older_worker, older_attempt,
    older_fenced, older_reported_at, newer_attempt, newer_worker, newer_started_at.
    """
    reports = reports.join(reattempted, ENTRY, "left_semi")
    starts = reports.where(
        (F.col("kind") == WORK_STARTED) & ~F.col("fenced") & F.col("attempt").isNotNull()
    ).select(
        *ENTRY,
        "work_group",
        F.col("id").alias("newer_id"),
        F.col("attempt").alias("newer_attempt"),
        F.col("worker").alias("newer_worker"),
        F.col("occurred_at").alias("newer_started_at"),
    )
    older = reports.where(F.col("attempt").isNotNull())
    # Attempts are numbered per group: an older attempt is older within its own group.
    pairs = older.join(starts, [*ENTRY, "work_group"]).where(
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


def completed_by_several(reports: DataFrame) -> DataFrame:
    """The issues whose accepted completions in one group name more than one worker: issue_key,
    work_group. Groups fanning out over one stream each complete their own work once. Few
    rows: the cheap first look of `duplicates`, which reads the details of these only."""
    return (
        completions(reports)
        .groupBy(_issue_key().alias("issue_key"), "work_group")
        .agg(F.min("worker").alias("first"), F.max("worker").alias("last"))
        .where(F.col("first") != F.col("last"))
        .select("issue_key", "work_group")
    )


def duplicates(reports: DataFrame, overlaps: DataFrame, several: DataFrame) -> DataFrame:
    """Issues worked twice: completed (accepted) by more than one consumer (`several`, from
    `completed_by_several`), or with two attempts running at once (`overlapping_attempts`).

    Columns: issue_id, consumers (sorted), reasons, entries (stream, entry_id).
    """
    entry = F.struct(*ENTRY)
    done = completions(reports).withColumn("issue_key", _issue_key())
    by_consumers = (
        done.join(several, ["issue_key", "work_group"])
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
