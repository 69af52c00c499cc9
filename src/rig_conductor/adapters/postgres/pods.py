"""The pods seen, remembered in PostgreSQL so the memory outlives a conductor and its leadership.

Decides nothing: which pods were seen, and which of some names ever were.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

# Pod names hold no commas: one joined string is cheaper to send than a large array.
_REMEMBER = text(
    """
    INSERT INTO pods_seen (tenant, namespace, pod, last_seen_at)
    SELECT :tenant, :namespace, name, now() FROM unnest(string_to_array(:names, ',')) AS name
    ON CONFLICT (tenant, namespace, pod) DO UPDATE SET last_seen_at = now()
    """
)
_SEEN = text(
    """
    SELECT pod FROM pods_seen
     WHERE tenant = :tenant AND namespace = :namespace
       AND pod = ANY(string_to_array(:names, ','))
    """
)
_FORGET = text("DELETE FROM pods_seen WHERE last_seen_at < now() - make_interval(days => :days)")


async def remember(
    engine: AsyncEngine, *, tenant: str, namespace: str, names: Collection[str]
) -> None:
    """Record `names` as seen now (one statement)."""
    if not names:
        return
    params = {"tenant": tenant, "namespace": namespace, "names": ",".join(names)}
    async with engine.begin() as conn:
        await conn.execute(_REMEMBER, params)


async def seen(
    engine: AsyncEngine, *, tenant: str, namespace: str, names: Collection[str]
) -> set[str]:
    """Which of `names` any conductor of the tenant has seen as pods."""
    if not names:
        return set()
    params = {"tenant": tenant, "namespace": namespace, "names": ",".join(names)}
    async with engine.connect() as conn:
        return {str(name) for name in (await conn.execute(_SEEN, params)).scalars()}


async def forget_older_than(engine: AsyncEngine, *, days: int) -> int:
    """Drop pods not seen for `days` (the event retention): names are reused after that."""
    async with engine.begin() as conn:
        return (await conn.execute(_FORGET, {"days": days})).rowcount
