"""Heartbeat intake: a batch of heartbeats in one statement, the latest state per agent and per
consumer with since when it holds and its open liveness interval, and the direct connection the
writer uses."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.engine import NO_PREPARE
from rig_conductor.domain import AgentId, ConsumerName


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    """One HEARTBEAT as received; its time is the server's receipt time, set on write."""

    agent_id: AgentId
    consumer: ConsumerName | None = None
    degraded: bool = False
    degraded_reasons: tuple[str, ...] = ()


# A batch of heartbeats in one statement, so a batch costs one round trip: the latest state per
# agent and per consumer upserted (the last heartbeat of a key in the batch wins; keys are
# locked in order, so concurrent batches cannot deadlock), and the liveness intervals kept.
# The statement records what was heard and decides no rule (migration 0019). Each row holds,
# beside its latest `degraded`, since when every heartbeat has reported that value, whatever the
# gaps between them (`status_since`; a change and a change back within one batch start it anew,
# at the batch's time): for a consumer, of the heartbeats naming it; for an agent, of those
# naming no consumer (`anonymous_at`, `anonymous_degraded`, `anonymous_since`), while its
# `degraded` is its latest heartbeat of any kind. Rule 3b's run is decided from them in policy
# (`policy.degraded.run_start`, docs/rules.md). `degraded_since` is still written, from the same
# facts, for the previous release's readers during a rolling upgrade; nothing here reads it.
# Each row also holds its open liveness interval (`heard_since`, `beats`). A heartbeat after a
# gap longer than %(break)s, or with another `degraded` than the row's, ends it: the interval
# is appended to `liveness` (read before the upsert, in the statement's snapshot) and a new one
# starts now. Nothing else is appended: durable storage grows with changes, not with beats.
# The statement is the function `rig_record_heartbeats` (migrations 0014, 0019), so that
# PostgreSQL plans it once per connection rather than once per batch (planning was most of a
# batch's time), with nothing prepared on the connection (PgBouncer). Constant text whatever the
# batch size: one statement, one round trip.
_HEARTBEATS_SQL = "SELECT rig_record_heartbeats(%(tenant)s, %(batch)s::jsonb, %(break)s)"


# A gap longer than this between two heartbeats ends a liveness interval (RIG_AGENT_DOWN_MS, so
# every gap that made an agent down is one between two intervals).
DEFAULT_BREAK_MS = 600_000


def _heartbeat_params(
    tenant: str, heartbeats: Sequence[HeartbeatIn], break_ms: int
) -> dict[str, Any]:
    # One JSON document for the whole batch: encoded in C, where driver-side arrays are not.
    batch = [[hb.agent_id, hb.consumer, hb.degraded, hb.degraded_reasons] for hb in heartbeats]
    return {
        "tenant": tenant,
        "batch": json.dumps(batch),
        "break": timedelta(milliseconds=break_ms),
    }


async def record_heartbeats(
    engine: AsyncEngine,
    *,
    tenant: str,
    heartbeats: Sequence[HeartbeatIn],
    break_ms: int = DEFAULT_BREAK_MS,
) -> datetime:
    """Store a batch of heartbeats; returns the receipt time PostgreSQL stamped on them. A gap
    longer than `break_ms` since an agent's or consumer's last heartbeat starts a new liveness
    interval."""
    async with engine.begin() as conn:
        params = _heartbeat_params(tenant, heartbeats, break_ms)
        result = await conn.exec_driver_sql(_HEARTBEATS_SQL, params)
        received_at: datetime = result.scalar_one()
    return received_at


async def connect_direct(
    url: str, *, connect_timeout: int = 5, **options: Any
) -> psycopg.AsyncConnection[Any]:
    """A psycopg connection of its own, outside the pool, autocommitting: for a hot writer that
    wants one round trip per batch and no pool checkout around it. Prepares nothing on the
    server (`engine.NO_PREPARE`: PgBouncer in transaction mode). `options`: more libpq
    parameters (application_name, keepalives...)."""
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    return await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, connect_timeout=connect_timeout, **NO_PREPARE, **options
    )


async def record_heartbeats_on(
    conn: psycopg.AsyncConnection[Any],
    *,
    tenant: str,
    heartbeats: Sequence[HeartbeatIn],
    break_ms: int = DEFAULT_BREAK_MS,
) -> datetime:
    """`record_heartbeats` on a direct connection: one statement, its own transaction."""
    cursor = await conn.execute(_HEARTBEATS_SQL, _heartbeat_params(tenant, heartbeats, break_ms))
    row = await cursor.fetchone()
    assert row is not None
    received_at: datetime = row[0]
    return received_at
