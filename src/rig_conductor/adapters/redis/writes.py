"""Every write to Redis a scan, an operator or the API's dispatch makes: appends once per
idempotency key, epoch markers, guarded claims, dead letters, their requeue and deletion, and
the removal of empty consumers. The one adapter module that changes streams: the import
contracts let only the write port (`effects`) and the dispatch import it (pyproject.toml).

Thin: keyword arguments in, domain objects out; no decisions. Reply shapes of Redis 6.2 and
7.x alike.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import ResponseError

from rig_conductor import logs
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import lua
from rig_conductor.adapters.redis.client import AnyRedis, is_clustered
from rig_conductor.adapters.redis.streams import DeadLettered, dlq_key
from rig_conductor.domain import ConsumerName, EntryId, GroupName, PendingEntry, StreamKey

# The claims' line keeps the logger it had beside the sweep's reads: operators filter on it.
claim_logger = logging.getLogger(logs.SWEEP_LOGGER)


async def append_once(
    client: AnyRedis,
    *,
    stream: StreamKey,
    key: str,
    fields: Mapping[str, str],
    remember_s: int,
) -> tuple[EntryId, bool]:
    """XADD `fields` unless `key` was appended within `remember_s`; (entry id, appended now)."""
    script = client.register_script(lua.APPEND_ONCE)
    marker = redis_keys.dispatched_key(stream, key, clustered=is_clustered(client))
    entry_id, appended = await script(keys=[stream, marker], args=_append_args(fields, remember_s))
    return EntryId(str(entry_id)), bool(appended)


async def append_once_replicated(
    client: Redis,
    *,
    stream: StreamKey,
    key: str,
    fields: Mapping[str, str],
    remember_s: int,
    replicas: int,
    timeout_ms: int,
) -> tuple[EntryId, bool, int]:
    """`append_once`, then WAIT on the same connection until `replicas` replicas hold it (or
    `timeout_ms` passes); (entry id, appended now, replicas that acknowledged).

    `client` talks to the server that holds the stream (on a cluster: its node's client), as
    WAIT counts the replication of the writes of its own connection only.
    """
    script = client.register_script(lua.APPEND_ONCE)
    marker = redis_keys.dispatched_key(stream, key, clustered=is_clustered(client))
    async with client.pipeline(transaction=False) as pipe:
        await script(keys=[stream, marker], args=_append_args(fields, remember_s), client=pipe)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        (entry_id, appended), acked = await pipe.execute()
    return EntryId(str(entry_id)), bool(appended), int(acked)


async def claim_epoch(client: AnyRedis, *, stream: StreamKey, epoch: str) -> tuple[str, bool]:
    """Set `epoch` beside `stream` unless a marker is there (no expiry: it must outlive every
    dispatch); (the marker now there, set now). Two conductors that both found it missing
    agree on the first one set."""
    script = client.register_script(lua.CLAIM_EPOCH)
    key = redis_keys.epoch_key(stream, clustered=is_clustered(client))
    found, claimed = await script(keys=[key], args=[epoch])
    return str(found), bool(claimed)


def _append_args(fields: Mapping[str, str], remember_s: int) -> list[str | int]:
    args: list[str | int] = [remember_s]
    for name, value in fields.items():
        args += [name, value]
    return args


async def delete_empty_consumers(
    client: Redis, *, consumers: Sequence[tuple[StreamKey, GroupName, ConsumerName]]
) -> list[str | None]:
    """XGROUP DELCONSUMER each (stream, group, consumer) that holds nothing, in one round trip.

    Per consumer: None when deleted, else why not (it holds entries again, or the group or
    stream is gone).
    """
    if not consumers:
        return []
    script = client.register_script(lua.DELETE_EMPTY_CONSUMER)
    async with client.pipeline(transaction=False) as pipe:
        for stream, group, consumer in consumers:
            await script(keys=[stream], args=[group, consumer], client=pipe)
        replies = await pipe.execute(raise_on_error=False)
    outcomes: list[str | None] = []
    for reply in replies:
        # A MOVED is reported like a refusal, not raised (`raise_moved`): hygiene has no retry,
        # the consumer stays, and the next scan reads its group where it lives now.
        if isinstance(reply, ResponseError):
            outcomes.append(str(reply))
        elif int(reply) < 0:
            outcomes.append("it holds pending entries again")
        else:
            outcomes.append(None)
    return outcomes


async def dead_letter(
    client: AnyRedis,
    *,
    stream: StreamKey,
    group: GroupName,
    entries: Iterable[PendingEntry],
    reason: str,
) -> list[DeadLettered]:
    """Copy each entry to the stream's DLQ with its diagnostics and XACK it, atomically per
    entry.

    An entry touched since the scan looked (acked, re-read, claimed elsewhere) is left alone and
    not returned.
    """
    entries = list(entries)
    if not entries:
        return []
    script = client.register_script(lua.DEAD_LETTER)
    keys = [stream, dlq_key(stream, client)]
    calls: list[list[str | int]] = [
        [group, entry.consumer, entry.id, entry.idle_ms, reason, entry.deliveries]
        for entry in entries
    ]
    if isinstance(client, RedisCluster):
        # The cluster client runs no scripts inside pipelines: one call each, on the stream's node.
        replies = [await script(keys=keys, args=args) for args in calls]
    else:
        async with client.pipeline(transaction=False) as pipe:
            for args in calls:
                await script(keys=keys, args=args, client=pipe)
            replies = await pipe.execute()
    done: list[DeadLettered] = []
    for entry, reply in zip(entries, replies, strict=True):
        if reply:
            dlq_id, deliveries, issue = reply
            done.append(DeadLettered(entry.id, dlq_id, int(deliveries), issue or None))
    return done


async def requeue(
    client: AnyRedis, *, stream: StreamKey, dlq_id: str
) -> tuple[str, str | None] | None:
    """Put a dead letter back on its stream as a new entry; None when there is no such letter."""
    [done] = await requeue_many(client, stream=stream, dlq_ids=[dlq_id])
    return done


async def requeue_many(
    client: AnyRedis, *, stream: StreamKey, dlq_ids: Sequence[str]
) -> list[tuple[str, str | None] | None]:
    """`requeue` each of `dlq_ids` (each atomic), in one round trip: per id, (the new entry's
    id, its issueId) or None when there was no such letter."""
    if not dlq_ids:
        return []
    script = client.register_script(lua.REQUEUE)
    keys = [dlq_key(stream, client), stream]
    if isinstance(client, RedisCluster):
        # The cluster client runs no scripts inside pipelines: one call each, on the stream's node.
        replies = [await script(keys=keys, args=[dlq_id]) for dlq_id in dlq_ids]
    else:
        async with client.pipeline(transaction=False) as pipe:
            for dlq_id in dlq_ids:
                await script(keys=keys, args=[dlq_id], client=pipe)
            replies = await pipe.execute()
    return [(str(r[0]), str(r[1]) if r[1] else None) if r else None for r in replies]


async def delete_dead_letters(
    client: AnyRedis, *, stream: StreamKey, dlq_ids: Sequence[str]
) -> list[bool]:
    """Delete each dead letter, in one round trip; per id, whether there was one to delete."""
    if not dlq_ids:
        return []
    key = dlq_key(stream, client)
    async with client.pipeline(transaction=False) as pipe:
        for dlq_id in dlq_ids:
            pipe.xdel(key, dlq_id)
        replies = await pipe.execute()
    return [bool(reply) for reply in replies]


class ClaimBatch(NamedTuple):
    """Entries to move to `target` with one XCLAIM, guarded by `min_idle_ms`."""

    target: ConsumerName
    min_idle_ms: int
    ids: Sequence[EntryId]


async def claim(
    client: Redis, *, stream: StreamKey, group: GroupName, batches: Sequence[ClaimBatch]
) -> list[list[EntryId]]:
    """XCLAIM ... JUSTID each batch, all in one round trip; per batch, the ids really moved.

    The min-idle guard makes each move atomic: an entry acked, re-read or claimed by someone
    else since it was seen is not idle enough and stays. XCLAIM JUSTID does not raise the
    delivery count. On Redis 7 an entry trimmed from the stream is dropped, not moved. A slot
    that moved is raised (`redis_client.raise_moved`): nothing moved, and the caller's retry
    claims where the stream lives now.
    """
    if not batches:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for batch in batches:
            pipe.xclaim(
                stream, group, batch.target, batch.min_idle_ms, list(batch.ids), justid=True
            )
        replies = await pipe.execute(raise_on_error=False)
    redis_client.raise_moved(replies)
    moved: list[list[EntryId]] = []
    for batch, reply in zip(batches, replies, strict=True):
        if isinstance(reply, ResponseError):
            claim_logger.info("Claim to %s in %s/%s failed: %s", batch.target, stream, group, reply)
            moved.append([])
        else:
            moved.append(reply)
    return moved
