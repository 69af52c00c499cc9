"""Table definitions (SQLAlchemy Core). The Alembic migrations in migrations/ create them.

Times are `timestamptz` stamped by PostgreSQL's own clock, the one clock every replica shares.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

metadata = MetaData()

agent_heartbeats = Table(
    "agent_heartbeats",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("agent_id", Text, primary_key=True),
    Column("last_heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("degraded", Boolean, nullable=False, server_default=text("false")),
    Column("degraded_reasons", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("first_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Written for the readers of the previous release only (migration 0019): nothing reads it.
    Column("degraded_since", DateTime(timezone=True)),
    # The open liveness interval (migration 0013): heard without a break since `heard_since`,
    # `beats` heartbeats in it. A break moves it to `liveness`.
    Column("heard_since", DateTime(timezone=True)),
    Column("beats", BigInteger, nullable=False, server_default=text("0")),
    # The agent's heartbeats that name no consumer (migration 0019): the latest one's time and
    # `degraded`, and since when every one of them has reported that `degraded`, whatever the
    # gaps between them. NULL: none heard. (`degraded` above is its latest heartbeat of any kind.)
    Column("anonymous_at", DateTime(timezone=True)),
    Column("anonymous_degraded", Boolean),
    Column("anonymous_since", DateTime(timezone=True)),
    # Who is silent past RIG_AGENT_FORGET_MS (migration 0009). Pages go by the primary key.
    Index("ix_agent_heartbeats_heard", "tenant", "last_heartbeat_at"),
)

consumer_heartbeats = Table(
    "consumer_heartbeats",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("consumer", Text, primary_key=True),
    Column("agent_id", Text, nullable=False),
    Column("last_heartbeat_at", DateTime(timezone=True), nullable=False),
    Column("degraded", Boolean, nullable=False, server_default=text("false")),
    Column("degraded_reasons", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("first_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Written for the readers of the previous release only (migration 0019): nothing reads it.
    Column("degraded_since", DateTime(timezone=True)),
    Column("heard_since", DateTime(timezone=True)),
    Column("beats", BigInteger, nullable=False, server_default=text("0")),
    # Since when every heartbeat naming the consumer has reported its `degraded`, whatever the
    # gaps between them (migration 0019). NULL: not known (a healthy row from before 0019).
    Column("status_since", DateTime(timezone=True)),
    # An agent's consumers by name (pages), freshest first (its 10 listed), and who is silent
    # past RIG_AGENT_FORGET_MS (migration 0009).
    Index("ix_consumer_heartbeats_agent", "tenant", "agent_id", "consumer"),
    Index(
        "ix_consumer_heartbeats_agent_fresh",
        "tenant",
        "agent_id",
        text("last_heartbeat_at DESC"),
        "consumer",
    ),
    Index("ix_consumer_heartbeats_heard", "tenant", "last_heartbeat_at"),
)

# The liveness history as intervals (migration 0013): an agent (consumer NULL) or a consumer
# heard from `heard_from` to `heard_to`, `beats` heartbeats, all with the same `degraded`, no
# gap between two of them longer than RIG_AGENT_DOWN_MS. A row is written when an interval
# ends (a longer gap, or `degraded` changed); the open one lives in the heartbeat tables. So
# durable storage grows with changes, not with beats. The audit reads both.
liveness = Table(
    "liveness",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("consumer", Text),
    Column("heard_from", DateTime(timezone=True), nullable=False),
    Column("heard_to", DateTime(timezone=True), nullable=False),
    Column("degraded", Boolean, nullable=False),
    Column("beats", BigInteger, nullable=False),
    Index("ix_liveness_heard_to", "heard_to"),
)

# Append-only: every dispatch, reclaim, dead letter and work report (heartbeats too, before
# migration 0013). The audit reads it.
events = Table(
    "events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("occurred_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("kind", Text, nullable=False),
    Column("agent_id", Text),
    Column("consumer", Text),
    Column("stream", Text),
    Column("group_name", Text),
    Column("entry_id", Text),
    Column("issue_id", Text),
    Column("attempt", Integer),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # A WORK_* report from an attempt older than the entry's current one: duplicate work.
    Column("fenced", Boolean, nullable=False, server_default=text("false")),
    # Reclaims are recorded one row per batch moved together: the batch's entry ids.
    Column("entry_ids", ARRAY(Text)),
    Index("ix_events_occurred_at", "occurred_at"),
    Index("ix_events_stream_entry", "stream", "entry_id"),
    Index("ix_events_issue", "issue_id"),
    # The RECLAIMED rows whose batch spans an entry's time (migration 0020): the story of a
    # piece of work. `rig_entry_span` is the migration's function of `entry_ids`.
    Index(
        "ix_events_entry_span",
        func.rig_entry_span(text("entry_ids")),
        postgresql_using="gist",
        postgresql_where=text("entry_ids IS NOT NULL"),
    ),
)

# One row per idempotency key: the entry a dispatch appended, so a repeat appends nothing.
dispatches = Table(
    "dispatches",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("stream", Text, nullable=False),
    Column("entry_id", Text, nullable=False),
    Column("issue_id", Text, nullable=False),
    Column("agent_id", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # What was appended (migration 0006): a dispatch a failover lost is appended again from it.
    Column("fields", JSONB(none_as_null=True)),
    Index("ix_dispatches_entry", "stream", "entry_id"),
    Index("ix_dispatches_created", "tenant", "created_at"),
)

# Per stream entry: who works on it and which attempt is current. Changed only by conditional
# updates, so a report from an older attempt is recognised and fenced off.
assignments = Table(
    "assignments",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("entry_id", Text, primary_key=True),
    Column("issue_id", Text),
    Column("state", Text, nullable=False),
    Column("consumer", Text),
    Column("attempt", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # The current attempt's last sign of progress (reaper rule 4b, docs/rules.md).
    Column("progress_at", DateTime(timezone=True)),
    # The accepted completion's staged files, `[{"staged": ..., "path": ...}]` (migration 0016),
    # written with the `done` that accepts them; `published_at` once an agent renamed them. NULL
    # outputs: nothing to publish.
    Column("outputs", JSONB),
    Column("published_at", DateTime(timezone=True)),
    # The group whose attempts this row holds (migration 0017): the first to work on the entry.
    # NULL: written before groups were recorded; the first group to report on it claims it.
    Column("group_name", Text),
    Index(
        "ix_assignments_unpublished",
        "tenant",
        "stream",
        postgresql_where=text("outputs IS NOT NULL AND published_at IS NULL"),
    ),
    # `superseded` (migration 0012): Redis lost the entry and its dispatch was appended again
    # as a new entry; nothing reported on the lost one counts any more.
    CheckConstraint(
        "state IN ('pending', 'running', 'done', 'failed', 'dead', 'superseded')",
        name="ck_assignments_state",
    ),
)

# The entry's attempts in each other group that reads its stream (migration 0017): work is
# owned per group, and `assignments` holds the first group's.
group_assignments = Table(
    "group_assignments",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("group_name", Text, primary_key=True),
    Column("entry_id", Text, primary_key=True),
    Column("issue_id", Text),
    Column("state", Text, nullable=False),
    Column("consumer", Text),
    Column("attempt", Integer, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("progress_at", DateTime(timezone=True)),
    Column("outputs", JSONB),
    Column("published_at", DateTime(timezone=True)),
    Index("ix_group_assignments_entry", "tenant", "stream", "entry_id"),
    Index(
        "ix_group_assignments_unpublished",
        "tenant",
        "stream",
        postgresql_where=text("outputs IS NOT NULL AND published_at IS NULL"),
    ),
    CheckConstraint(
        "state IN ('pending', 'running', 'done', 'failed', 'dead', 'superseded')",
        name="ck_group_assignments_state",
    ),
)

# Per dispatch stream, the epoch marker last seen beside it in Redis (migration 0012). A scan
# that finds Redis's marker gone, or another, knows Redis lost its data since (`reaper.redis_loss`).
redis_epochs = Table(
    "redis_epochs",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("epoch", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Agent pods a conductor of the tenant has listed: what a new leader knows was once there.
pods_seen = Table(
    "pods_seen",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("namespace", Text, primary_key=True),
    Column("pod", Text, primary_key=True),
    Column("last_seen_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


# One row per finished `rig-conductor audit`: its verdict, for the conductor's rig_audit_* gauges.
audit_runs = Table(
    "audit_runs",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("dispatched", BigInteger, nullable=False),
    Column("lost", BigInteger, nullable=False),
    Column("duplicates", BigInteger, nullable=False),
    Column("output", Text, nullable=False),
    Index("ix_audit_runs_tenant", "tenant", "id"),
)

scan_reports = Table(
    "scan_reports",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("dry_run", Boolean, nullable=False),
    Column("pending", BigInteger, nullable=False),
    Column("reclaimed", BigInteger, nullable=False),
    Column("dead_lettered", BigInteger, nullable=False),
    Column("report", JSONB, nullable=False),
    Index("ix_scan_reports_tenant", "tenant", "id"),
)

# Every conductor that takes heartbeats in marks, a few times a second, that it is listening: one
# row per replica and unbroken stretch, `heard_to` moved on by each mark. The gaps between the
# rows are the blind spells of reaper rule 3 (docs/rules.md, `policy.blind`).
listening = Table(
    "listening",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("tenant", Text, nullable=False),
    Column("replica", Text, nullable=False),
    Column("heard_from", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("heard_to", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_listening_tenant", "tenant", "heard_to"),
)

# The conductor's latest move to each consumer of a group (reaper rule 5): its XCLAIM reset the
# consumer's idle time, which is then no evidence that the consumer is alive.
move_targets = Table(
    "move_targets",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("group_name", Text, primary_key=True),
    Column("consumer", Text, primary_key=True),
    Column("moved_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_move_targets_moved", "tenant", "moved_at"),
)

# Who runs the scheduled scan when Kubernetes is off (`reaper.leader.LeaseRowElector`): one row
# per tenant, written only through `leases`, on PostgreSQL's clock (migration 0011).
reaper_lease = Table(
    "reaper_lease",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("holder", Text),  # NULL once released
    Column("acquired_at", DateTime(timezone=True), nullable=False),
    Column("renewed_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

# What the last scan measured, for the views (migration 0015): one row per group it read, and
# one per tenant for the agents. `top` holds the consumers with the most pending entries,
# `[{"name", "pending", "idleMs", "agentId"}]`, at most `policy.measure.TOP_CONSUMERS`.
group_measurements = Table(
    "group_measurements",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("stream", Text, primary_key=True),
    Column("group_name", Text, primary_key=True),
    Column("pending", BigInteger, nullable=False),
    Column("consumers", BigInteger, nullable=False),
    Column("consumers_down", BigInteger, nullable=False),
    Column("held_by_down", BigInteger, nullable=False),
    Column("oldest_idle_ms", BigInteger),
    Column("dead_letters", BigInteger, nullable=False),  # in the stream's dead-letter stream
    Column("top", JSONB, nullable=False),
    Column("measured_at", DateTime(timezone=True), nullable=False),
)

fleet_measurements = Table(
    "fleet_measurements",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("agents_up", BigInteger, nullable=False),
    Column("agents_down", BigInteger, nullable=False),
    Column("agents_degraded", BigInteger, nullable=False),
    Column("measured_at", DateTime(timezone=True), nullable=False),
)
