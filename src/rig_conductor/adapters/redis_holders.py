"""Who holds a stream entry in a group: one XPENDING on the group named, whatever the number of
groups the stream has.

A WORK_STARTED must come from a consumer that holds the entry in the group it names (contract:
"Who may speak for whom"): an agent that never read the entry, or whose entry was moved away,
may not start it.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

from rig_conductor.adapters.redis_client import AnyRedis
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
