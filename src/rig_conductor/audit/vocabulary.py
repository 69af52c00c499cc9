"""The event log's vocabulary as the audit reads it: its kinds, the statuses and reasons the
audit names, and the schemas of the frames the rules take. No rules: `reconcile` has those.
"""

from __future__ import annotations

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

from rig_conductor.domain import EventKind

# The kinds are the conductor's own (`domain.EventKind`), taken as plain text: Spark compares
# them with the `kind` column's strings.
ISSUE_ASSIGNED = EventKind.ISSUE_ASSIGNED.value
WORK_STARTED = EventKind.WORK_STARTED.value
WORK_COMPLETED = EventKind.WORK_COMPLETED.value
WORK_FAILED = EventKind.WORK_FAILED.value
WORK_PROGRESS = EventKind.WORK_PROGRESS.value
WORK_PUBLISHED = EventKind.WORK_PUBLISHED.value
WORK_KINDS = (WORK_STARTED, WORK_PROGRESS, WORK_COMPLETED, WORK_FAILED)
RECLAIMED = EventKind.RECLAIMED.value
DEAD_LETTERED = EventKind.DEAD_LETTERED.value
DEAD_LETTER_REQUEUED = EventKind.DEAD_LETTER_REQUEUED.value
HEARTBEAT = EventKind.HEARTBEAT.value
CONSUMER_WITHOUT_HEARTBEAT = EventKind.CONSUMER_WITHOUT_HEARTBEAT.value
# The kinds whose `detail` the rules read; other rows may carry it as NULL. ISSUE_ASSIGNED's
# `replaces` names the entry a dispatch Redis lost was appended again in place of;
# WORK_COMPLETED's `outputs` counts the files it staged, WORK_PUBLISHED's `missing` the ones
# found nowhere.
DETAIL_KINDS = (
    ISSUE_ASSIGNED,
    RECLAIMED,
    DEAD_LETTERED,
    DEAD_LETTER_REQUEUED,
    WORK_COMPLETED,
    WORK_PUBLISHED,
)

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

# An agent heard without a break (the liveness intervals, migration 0013): `beats` heartbeats
# from `heard_from` to `heard_to`, no gap between two of them longer than RIG_AGENT_DOWN_MS.
INTERVALS_SCHEMA = StructType(
    [
        StructField("agent_id", StringType(), False),
        StructField("heard_from", TimestampType(), False),
        StructField("heard_to", TimestampType(), False),
        StructField("beats", LongType(), False),
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
