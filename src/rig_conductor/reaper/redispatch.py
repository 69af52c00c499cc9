"""Dispatches the streams' Redis lost: appended again, once, under their idempotency key.

Replication to a Redis replica is asynchronous: a master that dies right after answering a
dispatch may take the entry with it, and the replica that takes over never saw it (nor its
idempotency marker). PostgreSQL recorded the dispatch, with its fields. Each scan looks at the
dispatches of the last `WINDOW_S` that no agent has reported on; one whose marker is missing
from Redis was lost, and is appended again through the same at-most-once script, so two
conductors, or a client retrying at the same moment, still make one entry. A dispatch an agent
had already started is not appended again here (it could run twice); `RIG_REDIS_WAIT_REPLICAS`
is what keeps those from being lost. When Redis lost all of its data (restarted empty),
`redis_loss` appends every unfinished dispatch again, started or not, and fences the lost
entries off.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches, recovery
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import AnyRedis, Topology, node_for
from rig_conductor.domain import EntryId, StreamKey
from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

logger = logging.getLogger(__name__)

WINDOW_S = 600.0
LIMIT = 50_000
REASON = "lost"


async def redispatch_lost(
    topology: Topology,
    *,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool,
    metrics: Metrics | None = None,
) -> int:
    """Append again the recent dispatches Redis no longer knows; how many (would be) appended."""
    recent = await dispatches.recent_unstarted(
        engine, tenant=settings.tenant, window_s=WINDOW_S, limit=LIMIT
    )
    if not recent:
        return 0
    await topology.nodes()  # the slot map, for `owner`
    by_node: dict[str, list[dispatches.RecentDispatch]] = {}
    for item in recent:
        by_node.setdefault(topology.owner(item.stream), []).append(item)
    count = 0
    for items in by_node.values():
        node = await node_for(topology, items[0].stream)
        present = await redis_streams.dispatch_markers(
            node.client, items=[(StreamKey(d.stream), d.key) for d in items]
        )
        for item, known in zip(items, present, strict=True):
            if known is not None:
                continue
            if dry_run:
                logger.warning(
                    "DRY RUN: would append dispatch %s again: %s is missing from %s",
                    item.issue_id,
                    item.entry_id,
                    item.stream,
                )
                count += 1
            elif await _append_again(node.client, item, engine, settings, metrics):
                count += 1
    return count


async def _append_again(
    redis: Redis,
    item: dispatches.RecentDispatch,
    engine: AsyncEngine,
    settings: Settings,
    metrics: Metrics | None,
) -> bool:
    """Append a lost dispatch once more (once per key, whoever else tries) and record where it
    lives now; False when another conductor appended it first."""
    entry_id, appended = await append_dispatch(redis, item, settings=settings)
    if not appended:
        return False
    async with engine.begin() as conn:
        await recovery.reappended(conn, tenant=settings.tenant, dispatch=item, entry_id=entry_id)
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


async def append_dispatch(
    redis: AnyRedis, dispatch: dispatches.RecentDispatch, *, settings: Settings
) -> tuple[EntryId, bool]:
    """Append `dispatch` to its stream again, at most once per idempotency key whoever else
    tries (the key is remembered as long as the event log keeps events); its entry id, and
    whether this call appended it."""
    return await redis_streams.append_once(
        redis,
        stream=StreamKey(dispatch.stream),
        key=dispatch.key,
        fields=dispatch.fields,
        remember_s=settings.event_retention_days * 86_400,
    )
