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
