"""Heartbeat intake: a batch of heartbeats in one statement, the latest state per agent and per
consumer with its open liveness interval, and the direct connection the writer uses."""

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
# `degraded_since` follows the degraded run (rule 3b): it keeps its start while every heartbeat
# since was degraded, restarts at now() when the run broke (also within this batch), and is
# NULL when the latest heartbeat is healthy. An agent's run counts only heartbeats that name no
# consumer: a consumer's own heartbeats decide for that consumer alone.
# Each row also holds its open liveness interval (`heard_since`, `beats`). A heartbeat after a
# gap longer than %(break)s, or with another `degraded` than the row's, ends it: the interval
# is appended to `liveness` (read before the upsert, in the statement's snapshot) and a new one
# starts now. Nothing else is appended: durable storage grows with changes, not with beats.
# Constant text whatever the batch size: one statement, one round trip.
_HEARTBEATS_SQL = """
WITH batch AS (
    SELECT item->>0 AS agent_id, item->>1 AS consumer, (item->>2)::boolean AS degraded,
           item->3 AS reasons, ord
      FROM jsonb_array_elements(%(batch)s::jsonb) WITH ORDINALITY AS b(item, ord)
), latest_agent AS (
    SELECT DISTINCT ON (agent_id) agent_id, degraded, reasons,
           count(*) OVER w AS beats,
           bool_or(consumer IS NULL) OVER w AS anonymous,
           bool_and(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_all_degraded,
           array_agg(degraded) FILTER (WHERE consumer IS NULL) OVER w AS anonymous_runs
      FROM batch
    WINDOW w AS (PARTITION BY agent_id ORDER BY ord
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
     ORDER BY agent_id, ord DESC
), latest_consumer AS (
    SELECT DISTINCT ON (consumer) consumer, agent_id, degraded, reasons,
           count(*) OVER (PARTITION BY consumer) AS beats,
           bool_and(degraded) OVER (PARTITION BY consumer) AS all_degraded
      FROM batch WHERE consumer IS NOT NULL ORDER BY consumer, ord DESC
), ended AS (
    INSERT INTO liveness (tenant, agent_id, consumer, heard_from, heard_to, degraded, beats)
    SELECT a.tenant, a.agent_id, NULL, COALESCE(a.heard_since, a.last_heartbeat_at),
           a.last_heartbeat_at, a.degraded, a.beats
      FROM agent_heartbeats a JOIN latest_agent l ON a.agent_id = l.agent_id
     WHERE a.tenant = %(tenant)s
       AND (a.last_heartbeat_at < now() - %(break)s OR a.degraded <> l.degraded)
    UNION ALL
    SELECT c.tenant, c.agent_id, c.consumer, COALESCE(c.heard_since, c.last_heartbeat_at),
           c.last_heartbeat_at, c.degraded, c.beats
      FROM consumer_heartbeats c JOIN latest_consumer l ON c.consumer = l.consumer
     WHERE c.tenant = %(tenant)s
       AND (c.last_heartbeat_at < now() - %(break)s OR c.degraded <> l.degraded)
), agents AS (
    INSERT INTO agent_heartbeats AS a (tenant, agent_id, last_heartbeat_at, degraded,
                                       degraded_reasons, degraded_since, heard_since, beats)
    SELECT %(tenant)s, agent_id, now(), degraded, reasons,
           CASE WHEN anonymous_runs[array_upper(anonymous_runs, 1)] THEN now() END, now(), beats
      FROM latest_agent ORDER BY agent_id
    ON CONFLICT (tenant, agent_id) DO UPDATE
       SET last_heartbeat_at = EXCLUDED.last_heartbeat_at, degraded = EXCLUDED.degraded,
           degraded_reasons = EXCLUDED.degraded_reasons,
           degraded_since = CASE
               WHEN NOT (SELECT anonymous FROM latest_agent l WHERE l.agent_id = a.agent_id)
                   THEN a.degraded_since
               WHEN (SELECT anonymous_all_degraded FROM latest_agent l
                      WHERE l.agent_id = a.agent_id)
                   THEN COALESCE(a.degraded_since, now())
               ELSE EXCLUDED.degraded_since END,
           heard_since = CASE
               WHEN a.last_heartbeat_at < now() - %(break)s OR a.degraded <> EXCLUDED.degraded
                   THEN now() ELSE COALESCE(a.heard_since, a.last_heartbeat_at) END,
           beats = CASE
               WHEN a.last_heartbeat_at < now() - %(break)s OR a.degraded <> EXCLUDED.degraded
                   THEN EXCLUDED.beats ELSE a.beats + EXCLUDED.beats END
), consumers AS (
    INSERT INTO consumer_heartbeats AS c (tenant, consumer, agent_id, last_heartbeat_at,
                                          degraded, degraded_reasons, degraded_since,
                                          heard_since, beats)
    SELECT %(tenant)s, consumer, agent_id, now(), degraded, reasons,
           CASE WHEN degraded THEN now() END, now(), beats
      FROM latest_consumer ORDER BY consumer
    ON CONFLICT (tenant, consumer) DO UPDATE
       SET agent_id = EXCLUDED.agent_id, last_heartbeat_at = EXCLUDED.last_heartbeat_at,
           degraded = EXCLUDED.degraded, degraded_reasons = EXCLUDED.degraded_reasons,
           degraded_since = CASE
               WHEN (SELECT all_degraded FROM latest_consumer l WHERE l.consumer = c.consumer)
                   THEN COALESCE(c.degraded_since, now())
               ELSE EXCLUDED.degraded_since END,
           heard_since = CASE
               WHEN c.last_heartbeat_at < now() - %(break)s OR c.degraded <> EXCLUDED.degraded
                   THEN now() ELSE COALESCE(c.heard_since, c.last_heartbeat_at) END,
           beats = CASE
               WHEN c.last_heartbeat_at < now() - %(break)s OR c.degraded <> EXCLUDED.degraded
                   THEN EXCLUDED.beats ELSE c.beats + EXCLUDED.beats END
)
SELECT now()
"""


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
