"""The reaper's lease row (table `reaper_lease`): take or renew it, release it. Decides nothing.

Each call is one autocommit statement, so it works through PgBouncer in transaction pooling
mode: nothing is kept in the session between calls. Every time is PostgreSQL's `now()`, never a
replica's clock: replicas compare their claims on one clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

# Take the lease when nobody holds it, its holder released it, or it has expired; renew it when
# we hold it. Either way it then runs `duration` seconds from now(). When somebody else holds
# it, the statement changes nothing and names them (read in the same statement: the name may
# trail a concurrent take-over, it is only for the log).
_TRY_SQL = """
WITH taken AS (
    INSERT INTO reaper_lease AS l (tenant, holder, acquired_at, renewed_at, expires_at)
    VALUES (%(tenant)s, %(holder)s, now(), now(), now() + make_interval(secs => %(duration)s))
    ON CONFLICT (tenant) DO UPDATE
       SET holder = EXCLUDED.holder,
           acquired_at = CASE WHEN l.holder = EXCLUDED.holder THEN l.acquired_at ELSE now() END,
           renewed_at = now(),
           expires_at = EXCLUDED.expires_at
     WHERE l.holder = EXCLUDED.holder OR l.holder IS NULL OR l.expires_at <= now()
    RETURNING holder
)
SELECT holder, true FROM taken
UNION ALL
SELECT holder, false FROM reaper_lease
 WHERE tenant = %(tenant)s AND NOT EXISTS (SELECT FROM taken)
"""

# Hand the lease back: no holder, expired now, so the next attempt of anyone takes it.
_RELEASE_SQL = """
UPDATE reaper_lease SET holder = NULL, expires_at = now()
 WHERE tenant = %(tenant)s AND holder = %(holder)s
"""


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """The outcome of one attempt: whether we lead (hold the lease) now, and who holds it."""

    leading: bool
    holder: str | None


async def try_take(
    conn: psycopg.AsyncConnection[Any], *, tenant: str, holder: str, duration_s: float
) -> LeaseClaim:
    """Take or renew the tenant's lease for `duration_s` from PostgreSQL's now()."""
    cursor = await conn.execute(
        _TRY_SQL, {"tenant": tenant, "holder": holder, "duration": float(duration_s)}
    )
    row = await cursor.fetchone()
    if row is None:  # the row was inserted by a concurrent attempt not yet visible to ours
        return LeaseClaim(leading=False, holder=None)
    return LeaseClaim(leading=bool(row[1]), holder=row[0])


async def release(conn: psycopg.AsyncConnection[Any], *, tenant: str, holder: str) -> bool:
    """Give the lease up if `holder` still holds it; True when it did."""
    cursor = await conn.execute(_RELEASE_SQL, {"tenant": tenant, "holder": holder})
    return cursor.rowcount == 1
