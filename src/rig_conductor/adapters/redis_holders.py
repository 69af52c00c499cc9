"""Who holds a stream entry: the consumers whose pending lists name it, one per group.

A WORK_STARTED must come from a consumer that holds the entry (contract: "Who may speak for
whom"): an agent that never read the entry, or whose entry was moved away, may not start it.
"""

from __future__ import annotations

from redis.exceptions import ResponseError

from rig_conductor.adapters.redis_client import AnyRedis
from rig_conductor.domain import ConsumerName, EntryId, StreamKey

# KEYS: stream. ARGV: entry id. Returns the holder in each group whose pending list has the
# entry (one per group: Redis keeps an entry in one consumer's list per group); {} for a stream
# that does not exist. One round trip, and one consistent look across the groups.
_HOLDERS_LUA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local holders = {}
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name
  for i = 1, #group, 2 do
    if group[i] == 'name' then name = group[i + 1] end
  end
  local found = redis.call('XPENDING', KEYS[1], name, ARGV[1], ARGV[1], 1)
  if #found == 1 then table.insert(holders, found[1][2]) end
end
return holders
"""


async def holders(client: AnyRedis, *, stream: StreamKey, entry_id: EntryId) -> set[ConsumerName]:
    """The consumers holding `entry_id` in a pending list of `stream` (empty: nobody)."""
    script = client.register_script(_HOLDERS_LUA)
    try:
        found = await script(keys=[stream], args=[entry_id])
    except ResponseError as exc:
        if "WRONGTYPE" in str(exc):  # not a stream: nobody holds anything in it
            return set()
        raise
    return {ConsumerName(name if isinstance(name, str) else name.decode()) for name in found}


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
