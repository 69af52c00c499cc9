"""Who holds a stream entry in a group: one XPENDING on the group named, whatever the number of
groups the stream has.

A WORK_STARTED must come from a consumer that holds the entry in the group it names (contract:
"Who may speak for whom"): an agent that never read the entry, or whose entry was moved away,
may not start it.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.exceptions import ResponseError

from rig_conductor.adapters.redis.client import AnyRedis, raise_moved
from rig_conductor.domain import ConsumerName, EntryId, GroupName, StreamKey

# An event of the previous release names no group: the groups searched for its holder, at most
# (each costs one XPENDING, pipelined, never one atomic script that would block Redis).
LEGACY_GROUPS_MAX = 100


async def holders_by_group(
    client: AnyRedis, *, stream: StreamKey, entry_id: EntryId
) -> dict[GroupName, ConsumerName] | None:
    """The consumer holding `entry_id` in each group of `stream` that has it pending; None when
    the stream has more than LEGACY_GROUPS_MAX groups (the event must name its group)."""
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError as exc:
        if "no such key" in str(exc).lower() or "WRONGTYPE" in str(exc):
            return {}
        raise
    if len(groups) > LEGACY_GROUPS_MAX:
        return None
    names = [GroupName(_text(group["name"])) for group in groups]
    if not names:
        return {}
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.xpending_range(stream, name, min=entry_id, max=entry_id, count=1)
        found = await pipe.execute()
    return {
        name: ConsumerName(_text(rows[0]["consumer"]))
        for name, rows in zip(names, found, strict=True)
        if rows
    }


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def held_in_group(
    client: AnyRedis, *, stream: StreamKey, group: str, entry_id: EntryId
) -> tuple[ConsumerName, int] | None:
    """The consumer holding `entry_id` in `group`'s pending list, and its delivery count; None
    when nobody does (or the stream or group does not exist). One XPENDING, whatever the
    number of groups."""
    try:
        found = await client.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
    except ResponseError as exc:
        if "NOGROUP" in str(exc) or "WRONGTYPE" in str(exc):
            return None
        raise
    if not found:
        return None
    consumer = found[0]["consumer"]
    name = consumer.decode() if isinstance(consumer, bytes) else str(consumer)
    return ConsumerName(name), int(found[0]["times_delivered"])


async def entry_exists(client: AnyRedis, *, stream: StreamKey, entry_id: EntryId) -> bool:
    """Whether `stream` still holds `entry_id` (not trimmed, not deleted)."""
    try:
        found = await client.xrange(stream, min=entry_id, max=entry_id, count=1)
    except ResponseError as exc:
        if "WRONGTYPE" in str(exc):
            return False
        raise
    return bool(found)


@dataclass(frozen=True, slots=True)
class GroupHold:
    """One group of a stream and what it holds of one entry."""

    group: str
    last_delivered_id: str
    holder: ConsumerName | None
    idle_ms: int | None
    deliveries: int | None


@dataclass(frozen=True, slots=True)
class EntryLook:
    """An entry as Redis shows it now: its fields (None when the stream no longer has it) and
    every group of its stream, with the consumer holding it there."""

    fields: dict[str, str] | None
    groups: tuple[GroupHold, ...]


# The most groups of one stream an entry's look reports.
MAX_GROUPS = 100


async def look(client: AnyRedis, *, stream: StreamKey, entry_id: EntryId) -> EntryLook:
    """Two round trips: the stream's groups (XINFO GROUPS) and the entry itself (XRANGE), then
    one `XPENDING <stream> <group> <id> <id> 1` per group, pipelined."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.xrange(stream, min=entry_id, max=entry_id, count=1)
        pipe.xinfo_groups(stream)
        found, groups = await pipe.execute(raise_on_error=False)
    raise_moved((found, groups))  # not "no such key": the question went to the wrong server
    if isinstance(found, ResponseError):
        if "WRONGTYPE" in str(found):
            return EntryLook(None, ())
        raise found
    if isinstance(found, Exception):
        raise found
    if isinstance(groups, ResponseError):  # no such key: no groups
        groups = []
    elif isinstance(groups, Exception):
        raise groups
    fields = {_text(k): _text(v) for k, v in found[0][1].items()} if found else None
    named = [(_text(g["name"]), _text(g["last-delivered-id"])) for g in groups[:MAX_GROUPS]]
    async with client.pipeline(transaction=False) as pipe:
        for name, _ in named:
            pipe.xpending_range(stream, name, min=entry_id, max=entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False) if named else []
    raise_moved(replies)  # not "nobody holds it"
    holds: list[GroupHold] = []
    for (name, last), reply in zip(named, replies, strict=True):
        row = reply[0] if isinstance(reply, list) and reply else None
        holds.append(
            GroupHold(
                name,
                last,
                ConsumerName(_text(row["consumer"])) if row else None,
                int(row["time_since_delivered"]) if row else None,
                int(row["times_delivered"]) if row else None,
            )
        )
    return EntryLook(fields, tuple(holds))


async def held_in_group_many(
    client: AnyRedis, *, stream: StreamKey, group: str, entry_ids: list[str]
) -> dict[str, ConsumerName]:
    """The consumer holding each of `entry_ids` in `group` (those nobody holds left out): one
    `XPENDING <stream> <group> <id> <id> 1` per id, pipelined."""
    async with client.pipeline(transaction=False) as pipe:
        for entry_id in entry_ids:
            pipe.xpending_range(stream, group, min=entry_id, max=entry_id, count=1)
        replies = await pipe.execute(raise_on_error=False)
    held: dict[str, ConsumerName] = {}
    for entry_id, reply in zip(entry_ids, replies, strict=True):
        if isinstance(reply, Exception):
            raise reply
        if reply:
            held[entry_id] = ConsumerName(_text(reply[0]["consumer"]))
    return held
