"""Counts over the entries' statuses, pure DataFrame transforms: the lost entries in stream
order, the per-stream dead-letter rate and the audit's totals. The statuses come from
`reconcile.entry_status`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rig_conductor.audit.reconcile import entry_order
from rig_conductor.audit.vocabulary import COMPLETED, DEAD, ENTRY, IN_PEL, LOST, PENDING


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
