"""Reads and small changes for the operator console: one consumer's pending entries a page at a
time, the fields of entries, dead-letter counts and pages (deleting one is `writes`'), and the
markers of signed-out sessions.

Every read is bounded: a page of a consumer's pending list is one `XPENDING ... <count>
<consumer>` from a cursor (the consumer's own list, never the group's), however long it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis.client import AnyRedis, is_clustered, raise_moved
from rig_conductor.adapters.redis.streams import (
    RAW,
    DeadLetter,
    dead_letter_of,
    dlq_key,
    list_dead_letters,
)
from rig_conductor.domain import ConsumerName, EntryId, GroupName, PendingEntry, StreamKey


@dataclass(frozen=True, slots=True)
class PendingRow:
    id: str
    consumer: str
    idle_ms: int
    deliveries: int
    # The entry's fields; None when the entry is gone from the stream (trimmed or deleted).
    fields: dict[str, str] | None


async def pending_page(
    client: AnyRedis,
    *,
    stream: StreamKey,
    group: GroupName,
    consumer: ConsumerName | None,
    after: str | None,
    count: int,
) -> list[PendingRow]:
    """Up to `count` of `consumer`'s pending entries (None: the group's) with ids above
    `after`, oldest first, with their fields: two round trips whatever the length of the
    list."""
    rows: list[dict[str, Any]] = await client.xpending_range(
        stream,
        group,
        min="(" + after if after else "-",
        max="+",
        count=count,
        consumername=consumer,
    )
    ids = [str(row["message_id"]) for row in rows]
    fields = await entry_fields(client, stream=stream, ids=ids)
    return [
        PendingRow(
            str(row["message_id"]),
            str(row["consumer"]),
            int(row["time_since_delivered"]),
            int(row["times_delivered"]),
            fields.get(str(row["message_id"])),
        )
        for row in rows
    ]


async def held_by(
    client: AnyRedis,
    *,
    stream: StreamKey,
    group: GroupName,
    consumer: ConsumerName,
    ids: Sequence[str],
) -> dict[str, PendingEntry]:
    """Each of `ids` that `consumer` holds now, with its idle time and delivery count as Redis
    sees them: one `XPENDING <stream> <group> <id> <id> 1 <consumer>` per id, pipelined, so one
    round trip and a cheap lookup each, however long the pending list. Redis refusing the
    lookup (no such group) raises."""
    if not ids:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for entry_id in ids:
            pipe.xpending_range(
                stream, group, min=entry_id, max=entry_id, count=1, consumername=consumer
            )
        replies = await pipe.execute(raise_on_error=False)
    found: dict[str, PendingEntry] = {}
    for entry_id, reply in zip(ids, replies, strict=True):
        if isinstance(reply, Exception):
            raise reply
        for row in reply:
            found[entry_id] = PendingEntry(
                EntryId(str(row["message_id"])),
                ConsumerName(str(row["consumer"])),
                int(row["time_since_delivered"]),
                int(row["times_delivered"]),
            )
    return found


async def entry_fields(
    client: AnyRedis, *, stream: StreamKey, ids: Sequence[str]
) -> dict[str, dict[str, str]]:
    """The fields of each entry still in the stream, in one pipelined round trip."""
    if not ids:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for entry_id in ids:
            pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False)
    raise_moved(replies)  # not "the entry is gone"
    found: dict[str, dict[str, str]] = {}
    for entry_id, reply in zip(ids, replies, strict=True):
        if isinstance(reply, list) and reply:
            found[entry_id] = dict(reply[0][1])
    return found


async def dead_letter_counts_on_node(
    client: Redis, *, streams: Sequence[StreamKey], clustered: bool
) -> dict[StreamKey, int]:
    """XLEN of the DLQ of each of `streams`, all on the node `client` talks to (a stream's DLQ
    lives where it does), in one round trip; a name with no DLQ possible counts 0."""
    keys: dict[StreamKey, StreamKey] = {}
    for stream in streams:
        with contextlib.suppress(redis_keys.BadStreamName):
            keys[stream] = redis_keys.dlq_key(stream, clustered=clustered)
    async with client.pipeline(transaction=False) as pipe:
        for key in keys.values():
            pipe.xlen(key)
        lengths = await pipe.execute()
    found = dict(zip(keys, map(int, lengths), strict=True))
    return {stream: found.get(stream, 0) for stream in streams}


async def dead_letter_page(
    client: AnyRedis, *, stream: StreamKey, before: str | None, count: int
) -> tuple[list[DeadLetter], str | None]:
    """Up to `count` dead letters of `stream` older than `before`, newest first, and the cursor
    of the next page (None at the end)."""
    if before is None:
        letters = await list_dead_letters(client, stream=stream, count=count)
    else:
        letters = await list_dead_letters(client, stream=stream, count=count, before="(" + before)
    return letters, (letters[-1].dlq_id if len(letters) == count else None)


async def dead_letters_by_id(
    client: AnyRedis, *, stream: StreamKey, dlq_ids: Sequence[str]
) -> dict[str, DeadLetter]:
    """The dead letters of `stream` with these ids (those that exist), in one round trip."""
    if not dlq_ids:
        return {}
    key = dlq_key(stream, client)
    async with client.pipeline(transaction=False) as pipe:
        for dlq_id in dlq_ids:
            pipe.execute_command("XRANGE", key, dlq_id, dlq_id, "COUNT", 1, **RAW)
        replies = await pipe.execute()
    letters = (dead_letter_of(reply[0][0], reply[0][1]) for reply in replies if reply)
    return {letter.dlq_id: letter for letter in letters}


async def revoke_session(client: AnyRedis, *, stream: StreamKey, nonce: str, ttl_ms: int) -> None:
    """Mark a session signed out for `ttl_ms` (until it would have expired anyway)."""
    key = redis_keys.revoked_session_key(stream, nonce, clustered=is_clustered(client))
    await client.set(key, "1", px=max(1, ttl_ms))


async def session_revoked(client: AnyRedis, *, stream: StreamKey, nonce: str) -> bool:
    key = redis_keys.revoked_session_key(stream, nonce, clustered=is_clustered(client))
    return bool(await client.exists(key))
