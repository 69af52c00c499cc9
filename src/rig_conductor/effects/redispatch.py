"""A lost dispatch appended again: once per idempotency key, whoever else tries, its new entry
recorded, counted and logged. `reaper.redispatch` and `reaper.redis_loss` decide which
dispatches were lost; this only writes (in a dry run: `would_append` says what it would)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import dispatches, recovery_writes
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.domain import EntryId, StreamKey

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

# The lines keep the logger they had when the reaper wrote them itself: operators filter on it.
logger = logging.getLogger(logs.REDISPATCH_LOGGER)

REASON = "lost"


async def append_again(
    redis: AnyRedis,
    item: dispatches.RecentDispatch,
    *,
    engine: AsyncEngine,
    tenant: str,
    remember_s: int,
    metrics: Metrics | None,
) -> bool:
    """Append a lost dispatch once more (once per key, whoever else tries) and record where it
    lives now; False when another conductor appended it first."""
    entry_id, appended = await append_dispatch(redis, item, remember_s=remember_s)
    if not appended:
        return False
    async with engine.begin() as conn:
        await recovery_writes.reappended(conn, tenant=tenant, dispatch=item, entry_id=entry_id)
    if metrics is not None:
        metrics.redispatched.labels(item.stream, REASON).inc()
    logger.warning(
        "Dispatch %s was missing from %s (entry %s, lost with a failover or a restart "
        "of Redis); appended again as %s",
        item.issue_id,
        item.stream,
        item.entry_id,
        entry_id,
        extra={"issueId": item.issue_id, "stream": item.stream, "entryId": entry_id},
    )
    return True


def would_append(item: dispatches.RecentDispatch, *, logger: logging.Logger = logger) -> None:
    """A dry run's line for a dispatch it would append again (under the deciding module's
    logger)."""
    logger.warning(
        "DRY RUN: would append dispatch %s again: %s is missing from %s",
        item.issue_id,
        item.entry_id,
        item.stream,
    )


async def append_dispatch(
    redis: AnyRedis, dispatch: dispatches.RecentDispatch, *, remember_s: int
) -> tuple[EntryId, bool]:
    """Append `dispatch` to its stream again, at most once per idempotency key whoever else
    tries (the key is remembered `remember_s`, as long as the event log keeps events); its
    entry id, and whether this call appended it."""
    return await redis_writes.append_once(
        redis,
        stream=StreamKey(dispatch.stream),
        key=dispatch.key,
        fields=dispatch.fields,
        remember_s=remember_s,
    )
