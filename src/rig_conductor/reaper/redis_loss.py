"""Redis that lost its data: found by the epoch marker, every unfinished dispatch appended again.

Redis restarted without persistence, flushed, or failed over to an empty replica has lost every
stream, group, pending list and idempotency marker at once. `redispatch` only looks at recent
dispatches nobody started; this looks, once per loss, at every dispatch of the stream within
the event retention that is neither done nor dead-lettered, started or not, and appends each
again through the at-most-once script under its idempotency key, so two conductors, or a client
retrying at the same moment, still make one entry. The lost entry is fenced off first
(`superseded`): an agent that had it in hand when Redis lost it is answered 409 when it reports,
and only the new entry's completion counts. So at most the entries held in hand run twice, and
none is committed twice.

A loss is told by the epoch marker the conductor keeps beside each dispatch stream and
remembers in PostgreSQL (`policy.redis_loss.judge_epoch`). After a loss the first conductor to
look sets a new marker; the new one is remembered only once every unfinished dispatch has been
appended, so a conductor that dies half-way leaves the job to the next scan. This module
decides; the markers, the fences, the appends and their lines are the write port's
(`effects.redis_loss`), whose dry run writes none of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import dispatches, recovery
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import AnyRedis, Topology, node_for
from rig_conductor.domain import StreamKey
from rig_conductor.effects import redis_loss as writes
from rig_conductor.policy import redis_loss

logger = logging.getLogger(logs.REDIS_LOSS_LOGGER)

PAGE = 1_000  # unfinished dispatches read, and their markers looked up, at a time
REASON = writes.REASON


@dataclass(slots=True)
class Recovery:
    """What a look at the epochs found and did (in a dry run: would do)."""

    lost: list[str]  # streams whose Redis lost its data
    appended: int = 0  # dispatches appended again, or whose record followed another's append
    # Whether Redis holds the dispatches found missing now (not after a dry run's look).
    fixed: bool = True


async def recover(
    topology: Topology,
    *,
    engine: AsyncEngine,
    tenant: str,
    dispatch_stream: str,
    window_s: int,
    effects: writes.Recovering,
) -> Recovery:
    """Look at the epoch of every dispatch stream; after a loss, append its unfinished
    dispatches again (within `window_s`), through `effects`. Raises on Redis or PostgreSQL
    failure (the next scan tries again)."""
    remembered = await dispatches.remembered_epochs(engine, tenant=tenant)
    streams = sorted({dispatch_stream, *remembered})
    found = Recovery(lost=[], fixed=effects.fixes)
    for name in streams:
        stream = StreamKey(name)
        client = (await node_for(topology, stream)).client
        in_redis = await redis_streams.read_epoch(client, stream=stream)
        verdict = redis_loss.judge_epoch(in_redis=in_redis, remembered=remembered.get(stream))
        if verdict == "same":
            continue
        if verdict == "first-sight":
            await effects.first_sight(client, stream)
            continue
        found.lost.append(stream)
        epoch = await effects.lost(client, stream, in_redis)
        tally = await _recover_stream(
            client, stream, engine=engine, tenant=tenant, window_s=window_s, effects=effects
        )
        await effects.recovered(stream, epoch, tally)
        found.appended += tally.appended
    return found


async def _recover_stream(
    client: AnyRedis,
    stream: StreamKey,
    *,
    engine: AsyncEngine,
    tenant: str,
    window_s: int,
    effects: writes.Recovering,
) -> writes.Tally:
    tally = writes.Tally()
    groups = await recovery.groups_since(engine, tenant=tenant, stream=stream)
    after: tuple[datetime, str] | None = None
    while True:
        page = await recovery.unfinished(
            engine,
            tenant=tenant,
            stream=stream,
            window_s=window_s,
            groups=groups,
            after=after,
            limit=PAGE,
        )
        if not page:
            break
        after = (page[-1].created_at, page[-1].dispatch.key)
        markers = await redis_streams.dispatch_markers(
            client, items=[(stream, item.dispatch.key) for item in page]
        )
        for item, marker in zip(page, markers, strict=True):
            expected = recovery.expected_groups(groups, item)
            await _recover_dispatch(client, item, marker, tally, expected, effects=effects)
    return tally


async def _recover_dispatch(
    client: AnyRedis,
    item: recovery.Unfinished,
    marker: str | None,
    tally: writes.Tally,
    expected: list[str],
    *,
    effects: writes.Recovering,
) -> None:
    dispatch = item.dispatch
    action = redis_loss.judge_dispatch(recorded_entry=dispatch.entry_id, marker=marker)
    if action == "keep":
        tally.present += 1
        return
    if action == "append" and not item.appendable:
        tally.unrecorded += 1
        logger.error(
            "Dispatch %s (entry %s) was lost with Redis's data and cannot be appended again: "
            "it was recorded before its fields were kept. Dispatch it again",
            dispatch.issue_id,
            dispatch.entry_id,
            extra={"issueId": dispatch.issue_id, "stream": dispatch.stream},
        )
        return
    await effects.recover(client, dispatch, action, marker, tally, expected)
