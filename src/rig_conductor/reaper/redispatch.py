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
entries off. The appends, their records and lines are the write port's (`effects.redispatch`).
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import Topology, node_for
from rig_conductor.domain import StreamKey
from rig_conductor.effects.port import Effects

WINDOW_S = 600.0
LIMIT = 50_000


async def redispatch_lost(
    topology: Topology, *, engine: AsyncEngine, tenant: str, effects: Effects
) -> int:
    """Append again the recent dispatches Redis no longer knows (through `effects`: in a dry
    run, logged only); how many (would be) appended."""
    recent = await dispatches.recent_unstarted(
        engine, tenant=tenant, window_s=WINDOW_S, limit=LIMIT
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
            if known is None and await effects.append_lost(node.client, item):
                count += 1
    return count
