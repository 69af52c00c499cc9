"""Redis Streams reads: describe groups, dispatch and epoch markers, dead letters listed
(pending lists are paged in redis_sweep; every write is in redis.writes).

Thin: every function takes keyword arguments, talks to Redis and returns domain objects. No
decisions are made here. Works with the reply shapes of Redis 6.2 and 7.x.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.client import NEVER_DECODE

from rig_conductor.adapters.redis import consumer_summary
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import lag as redis_lag
from rig_conductor.adapters.redis.client import AnyRedis, is_clustered, raise_moved
from rig_conductor.domain import (
    ConsumerInfo,
    ConsumerName,
    EntryId,
    GroupInfo,
    GroupName,
    StreamKey,
)

logger = logging.getLogger(__name__)

_GLOB_CHARS = frozenset("*?[")


_DIAGNOSTICS = ("originalId", "stream", "group", "consumer", "deliveries", "reason")
# Options of a read whose reply is left as bytes, however the client decodes: what others wrote
# into a stream need not be UTF-8, and a strict decode would fail the whole read.
RAW: dict[str, Any] = {NEVER_DECODE: True}


async def dispatch_markers(
    client: AnyRedis, *, items: Sequence[tuple[StreamKey, str]]
) -> list[EntryId | None]:
    """Each (stream, idempotency key)'s append marker: the entry id it was appended as, None
    when the marker is missing; in one round trip."""
    if not items:
        return []
    clustered = is_clustered(client)
    async with client.pipeline(transaction=False) as pipe:
        for stream, key in items:
            pipe.get(redis_keys.dispatched_key(stream, key, clustered=clustered))
        replies = await pipe.execute()
    return [EntryId(str(reply)) if reply is not None else None for reply in replies]


async def read_epoch(client: AnyRedis, *, stream: StreamKey) -> str | None:
    """The epoch marker beside `stream`; None when Redis has none."""
    found = await client.get(redis_keys.epoch_key(stream, clustered=is_clustered(client)))
    return str(found) if found is not None else None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a `<stream>:dlq`: the diagnostics and the original fields."""

    dlq_id: str
    original_id: str
    group: str
    consumer: str
    deliveries: int | None  # None: not a count (a letter someone else wrote)
    reason: str
    fields: dict[str, str]


@dataclass(frozen=True, slots=True)
class DeadLettered:
    entry_id: EntryId
    dlq_id: str
    deliveries: int
    issue_id: str | None


def dlq_key(stream: StreamKey, client: AnyRedis | None = None) -> StreamKey:
    """The dead-letter stream of `stream` on the Redis `client` talks to."""
    return redis_keys.dlq_key(stream, clustered=client is not None and is_clustered(client))


def is_pattern(name: str) -> bool:
    return any(char in _GLOB_CHARS for char in name)


async def resolve_streams(client: Redis, *, names: Sequence[str]) -> list[StreamKey]:
    """Stream keys for RIG_STREAMS: literal names that exist as streams, plus glob matches.

    A literal name that is missing or not a stream is skipped with a log line. DLQ streams
    never match a pattern: dead letters are not work to reclaim.
    """
    found: dict[StreamKey, None] = {}
    literals = [name for name in names if not is_pattern(name)]
    if literals:
        async with client.pipeline(transaction=False) as pipe:
            for name in literals:
                pipe.type(name)
            types = await pipe.execute()
        for name, kind in zip(literals, types, strict=True):
            if kind == "stream":
                found[StreamKey(name)] = None
            else:
                logger.info(
                    "Stream %s skipped: %s",
                    name,
                    "no such key" if kind == "none" else f"a {kind}, not a stream",
                )
    for pattern in (name for name in names if is_pattern(name)):
        async for key in client.scan_iter(match=pattern, count=1000, _type="stream"):
            if not redis_keys.is_dlq(key):
                found[StreamKey(key)] = None
    return list(found)


async def describe_groups(
    client: Redis,
    *,
    streams: Sequence[StreamKey],
    others: int | None = None,
    only: str | None = None,
) -> list[GroupInfo]:
    """XINFO GROUPS, then XINFO CONSUMERS and the oldest pending entry (XPENDING - + 1) of every
    group (`only`: of the group of that name alone): two round trips in all. With `others`, each
    group's consumers are a summary instead (`consumer_summary`: those holding entries and the
    first `others` others, with the count): one round trip more, and what a scan of a million
    quiet consumers can afford."""
    groups = await _groups_of(client, streams)
    if only is not None:
        groups = [g for g in groups if g[1] == only]
    summaries: list[tuple[int, tuple[ConsumerInfo, ...]] | Exception] = []
    if others is not None:
        pairs = [(stream, group) for stream, group, _, _ in groups]
        summaries = await consumer_summary.summaries(client, pairs, others=others)
    async with client.pipeline(transaction=False) as pipe:
        for stream, group, pending, _ in groups:
            if others is None:
                pipe.xinfo_consumers(stream, group)
            if pending:
                pipe.xpending_range(stream, group, min="-", max="+", count=1)
        replies = await pipe.execute(raise_on_error=False)
    raise_moved(replies)  # a cluster slot moved since the map was read: the caller retries
    answers = iter(replies)
    described: list[GroupInfo] = []
    for n, (stream, group, pending, lag) in enumerate(groups):
        reply = summaries[n] if others is not None else next(answers)
        oldest = next(answers) if pending else []
        if isinstance(reply, Exception):
            logger.info("Group %s of stream %s skipped: %s", group, stream, reply)
            continue
        described.append(_group_info(stream, group, pending, reply, oldest, lag))
    return described


async def _groups_of(
    client: Redis, streams: Sequence[StreamKey]
) -> list[tuple[StreamKey, GroupName, int, int | None]]:
    """(stream, group, pending, lag) of every group of `streams` (XINFO GROUPS, one round
    trip; then `redis_lag.group_lags` for the groups whose lag Redis did not say)."""
    async with client.pipeline(transaction=False) as pipe:
        for stream in streams:
            pipe.xinfo_groups(stream)
        replies = await pipe.execute(raise_on_error=False)
    raise_moved(replies)  # a cluster slot moved since the map was read: the caller retries
    groups: list[tuple[StreamKey, GroupName, int, Mapping[str, Any]]] = []
    for stream, reply in zip(streams, replies, strict=True):
        if isinstance(reply, Exception):
            logger.info("Stream %s skipped: %s", stream, reply)
            continue
        groups.extend((stream, GroupName(g["name"]), int(g["pending"]), g) for g in reply)
    lags = await redis_lag.group_lags(client, [(stream, g) for stream, _, _, g in groups])
    return [
        (stream, name, pending, lag)
        for (stream, name, pending, _), lag in zip(groups, lags, strict=True)
    ]


def _group_info(
    stream: StreamKey,
    group: GroupName,
    pending: int,
    consumers: tuple[int, tuple[ConsumerInfo, ...]] | list[Mapping[str, Any]],
    oldest: Any,
    lag: int | None = None,
) -> GroupInfo:
    """From XINFO CONSUMERS' rows, or a summary (count, consumers)."""
    if isinstance(consumers, tuple):
        count, infos = consumers
    else:
        count, infos = None, tuple(_consumer_info(row) for row in consumers)
    first = oldest[0] if isinstance(oldest, list) and oldest else None
    return GroupInfo(
        stream,
        group,
        pending,
        infos,
        oldest_id=EntryId(first["message_id"]) if first else None,
        oldest_idle_ms=int(first["time_since_delivered"]) if first else None,
        count=count,
        lag=lag,
    )


def _consumer_info(row: Mapping[str, Any]) -> ConsumerInfo:
    inactive = row.get("inactive")  # Redis 7.2+; -1 when the consumer never read
    return ConsumerInfo(
        name=ConsumerName(row["name"]),
        pending=int(row["pending"]),
        idle_ms=int(row["idle"]),
        inactive_ms=int(inactive) if inactive is not None and int(inactive) >= 0 else None,
    )


async def list_dead_letters(
    client: AnyRedis, *, stream: StreamKey, count: int, before: str = "+"
) -> list[DeadLetter]:
    """The newest `count` dead letters of `stream` (ids up to `before`), newest first."""
    rows = await client.execute_command(
        "XREVRANGE", dlq_key(stream, client), before, "-", "COUNT", count, **RAW
    )
    return [dead_letter_of(dlq_id, fields) for dlq_id, fields in rows]


def dead_letter_of(dlq_id: str | bytes, fields: Mapping[Any, Any]) -> DeadLetter:
    """A DLQ entry's fields (read with RAW) as a `DeadLetter`: the diagnostics apart from the
    original fields. Best effort: anyone who may write the DLQ can put anything in it, and one
    odd letter must not hide the others, so bytes that are not UTF-8 are shown replaced and a
    `deliveries` that is not a count is None."""
    text = {_text(k): _text(v) for k, v in fields.items()}
    return DeadLetter(
        dlq_id=_text(dlq_id),
        original_id=text.get("originalId", ""),
        group=text.get("group", ""),
        consumer=text.get("consumer", ""),
        deliveries=_count(text.get("deliveries")),
        reason=text.get("reason", ""),
        fields={k: v for k, v in text.items() if k not in _DIAGNOSTICS},
    )


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _count(value: str | None) -> int | None:
    """A delivery count as the reaper writes it; None for anything else."""
    if value is None or not (value.isascii() and value.isdigit()) or len(value) > 20:
        return None
    return int(value)
