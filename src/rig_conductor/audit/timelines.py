"""The audit's measures over time, pure DataFrame transforms: reclaims and their latency, agent
availability from heartbeat gaps, pending entries over time, the detector's sightings."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    TimestampType,
)

from rig_conductor.audit.reconcile import json_field, millis_between, per_entry
from rig_conductor.audit.vocabulary import CONSUMER_WITHOUT_HEARTBEAT, HEARTBEAT, RECLAIMED


def reclaims(events: DataFrame) -> DataFrame:
    """One row per reclaimed entry, batches unrolled, with its latency: the reclaim's time minus
    the old owner's newest heartbeat (`lastHeartbeatAt`; NULL when it never sent one).

    Columns: event_id, reclaimed_at, stream, group_name, entry_id, from_consumer, from_agent,
    to_consumer, to_agent, reason, reasons (JSON), idle_ms, deliveries, last_heartbeat_at,
    latency_ms. `reason` is the move's (pod-gone, down, degraded, stalled, manual); rows written
    before reasons existed say `pod-gone` when the pod was gone, else `down`.
    """
    heartbeat = F.try_to_timestamp(json_field("lastHeartbeatAt"))
    reason = F.coalesce(
        json_field("reason"),
        F.when(F.instr(F.coalesce(json_field("reasons"), F.lit("")), '"pod-gone"') > 0, "pod-gone"),
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
        json_field("toConsumer").alias("to_consumer"),
        json_field("toAgent").alias("to_agent"),
        reason.alias("reason"),
        json_field("reasons").alias("reasons"),
        json_field("idleMs").try_cast("long").alias("idle_ms"),
        json_field("deliveries").try_cast("int").alias("deliveries"),
        heartbeat.alias("last_heartbeat_at"),
        millis_between(F.col("occurred_at"), heartbeat).alias("latency_ms"),
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


def heartbeat_gaps(
    events: DataFrame, intervals: DataFrame | None = None, *, window_end: datetime
) -> DataFrame:
    """Per agent, the time it was not heard: after each stretch of heartbeats, to the start of
    the next stretch, or to `window_end` after the last.

    A stretch is a liveness interval (`intervals`: agent_id, heard_from, heard_to, beats; no
    gap inside one is longer than RIG_AGENT_DOWN_MS) or, for heartbeats logged as events (before
    the intervals), one HEARTBEAT. Overlapping stretches leave no gap.

    Columns: agent_id, heard_from (the stretch's start), beats (in the stretch), gap_start (the
    last heartbeat before the gap), gap_end, gap_ms, open_ended (the gap after the newest beat).
    """
    end = F.lit(window_end).cast(TimestampType())
    points = events.where(
        (F.col("kind") == HEARTBEAT) & F.col("agent_id").isNotNull() & (F.col("occurred_at") <= end)
    ).select(
        "agent_id",
        F.col("occurred_at").alias("heard_from"),
        F.col("occurred_at").alias("heard_to"),
        F.lit(1).cast("long").alias("beats"),
    )
    stretches = points
    if intervals is not None:
        stretches = points.unionByName(
            intervals.where(F.col("heard_from") <= end).select(
                "agent_id",
                "heard_from",
                F.least(F.col("heard_to"), end).alias("heard_to"),
                F.col("beats").cast("long").alias("beats"),
            )
        )
    order = Window.partitionBy("agent_id").orderBy("heard_from", "heard_to")
    reach = F.max("heard_to").over(order.rowsBetween(Window.unboundedPreceding, 0))
    following = F.lead("heard_from").over(order)
    return stretches.select(
        "agent_id",
        "heard_from",
        "beats",
        reach.alias("gap_start"),
        F.coalesce(following, end).alias("gap_end"),
        following.isNull().alias("open_ended"),
    ).withColumn(
        "gap_ms", F.greatest(millis_between(F.col("gap_end"), F.col("gap_start")), F.lit(0.0))
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
            F.min("heard_from").alias("first_heartbeat"),
            F.max("gap_start").alias("last_heartbeat"),
            F.sum("beats").alias("heartbeats"),
            F.greatest(millis_between(F.max("gap_end"), F.min("heard_from")), F.lit(0.0)).alias(
                "observed_ms"
            ),
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
