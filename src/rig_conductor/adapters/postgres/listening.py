"""Listening marks: when a conductor could take heartbeats in (blind spells, rule 3: docs/rules.md).

Each replica that takes heartbeats in keeps one row per unbroken stretch of listening and moves
its `heard_to` on with every mark. A mark that comes too late for the stretch (the replica's
heartbeat writes failed, PostgreSQL was unreachable, the process was stopped) starts a new row.
Marks are serialised per tenant by a transaction-scoped advisory lock, so exactly one replica
sees each blind spell end; no session state is kept (PgBouncer's transaction pooling is fine).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.tables import listening
from rig_conductor.domain import Span


@dataclass(frozen=True, slots=True)
class Mark:
    """What one listening mark did: the row it extended or opened, and the blind spell it
    ended (the time since any replica last marked), if it ended one."""

    row_id: int
    ended_spell: Span | None = None


def _lock_key(tenant: str) -> int:
    digest = hashlib.blake2b(f"rig-conductor listening {tenant}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


async def mark(
    conn: psycopg.AsyncConnection[Any],
    *,
    tenant: str,
    replica: str,
    row_id: int | None,
    slack_ms: int,
) -> Mark:
    """Mark that `replica` is listening now, on an autocommit connection, in one transaction.

    `row_id` is the row of the replica's stretch (None at first). The stretch goes on when its
    last mark is within `slack_ms`; else a new row starts. When no replica of the tenant had
    marked within `slack_ms`, the returned mark carries the blind spell that just ended.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(tenant),))
        cursor = await conn.execute(
            "SELECT now(), max(heard_to) FROM listening WHERE tenant = %s", (tenant,)
        )
        row = await cursor.fetchone()
        assert row is not None
        now, last = row
        slack = timedelta(milliseconds=slack_ms)
        extended = None
        if row_id is not None:
            cursor = await conn.execute(
                "UPDATE listening SET heard_to = now() WHERE id = %s AND heard_to >= now() - %s "
                "RETURNING id",
                (row_id, slack),
            )
            extended = await cursor.fetchone()
        if extended is None:
            cursor = await conn.execute(
                "INSERT INTO listening (tenant, replica) VALUES (%s, %s) RETURNING id",
                (tenant, replica),
            )
            extended = await cursor.fetchone()
            assert extended is not None
    spell = Span(last, now) if last is not None and now - last > slack else None
    return Mark(int(extended[0]), spell)


async def heard(conn: AsyncConnection, *, tenant: str) -> tuple[Span, ...]:
    """Every listening stretch of the tenant, oldest first (pruned with the event log)."""
    rows = await conn.execute(
        select(listening.c.heard_from, listening.c.heard_to)
        .where(listening.c.tenant == tenant)
        .order_by(listening.c.heard_from)
    )
    return tuple(Span(start, end) for start, end in rows)


async def forget_older_than(engine: AsyncEngine, *, days: int) -> int:
    """Drop the listening stretches that ended more than `days` ago (the event retention):
    older than any heartbeat still judged."""
    statement = text("DELETE FROM listening WHERE heard_to < now() - make_interval(days => :days)")
    async with engine.begin() as conn:
        return (await conn.execute(statement, {"days": days})).rowcount
