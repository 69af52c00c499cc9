"""A group's consumers as a scan needs them at any size: every consumer holding entries, the
first few holding nothing (by name), and how many there are, from one script run where the
stream lives.

XINFO CONSUMERS of a group lists every consumer. At a million quiet consumers, parsing that
reply costs a scan seconds and holding it hundreds of megabytes, for rows it never acts on: a
consumer that holds nothing is only ever a target, and targets are ranked only in a group where
something moves, which the scan then reads in full. The script walks the reply inside Redis and
returns the rows that matter, flat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import AskError, MovedError

from rig_conductor.domain import ConsumerInfo, ConsumerName, GroupName, StreamKey

# Reply: the number of consumers, then name, pending, idle and inactive (-1: not reported, Redis
# before 7.2, or never read) of each consumer holding entries and of the first ARGV[2] others.
_SUMMARY_LUA = """
local rows = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local others = tonumber(ARGV[2])
local out = {#rows}
for _, row in ipairs(rows) do
  local name, pending, idle, inactive
  if row[1] == 'name' and row[3] == 'pending' and row[5] == 'idle' then
    name, pending, idle = row[2], row[4], row[6]  -- Redis's order: no table per row
    if row[7] == 'inactive' then inactive = row[8] end
  else
    local f = {}
    for j = 1, #row, 2 do f[row[j]] = row[j + 1] end
    name, pending, idle, inactive = f['name'], f['pending'], f['idle'], f['inactive']
  end
  local holds = pending > 0
  if holds or others > 0 then
    if not holds then others = others - 1 end
    out[#out + 1] = name
    out[#out + 1] = pending
    out[#out + 1] = idle
    out[#out + 1] = inactive or -1
  end
end
return out
"""


async def summaries(
    client: Redis, groups: Sequence[tuple[StreamKey, GroupName]], *, others: int
) -> list[tuple[int, tuple[ConsumerInfo, ...]] | Exception]:
    """Per group, in order: (how many consumers, the holders and the first `others` others), or
    the error Redis answered for it (a slot that moved is raised: the caller retries)."""
    if not groups:
        return []
    script = client.register_script(_SUMMARY_LUA)
    async with client.pipeline(transaction=False) as pipe:
        for stream, group in groups:
            await script(keys=[stream], args=[group, others], client=pipe)
        replies = await pipe.execute(raise_on_error=False)
    found: list[tuple[int, tuple[ConsumerInfo, ...]] | Exception] = []
    for reply in replies:
        if isinstance(reply, MovedError | AskError):
            raise reply
        found.append(reply if isinstance(reply, Exception) else _decode(reply))
    return found


def _decode(reply: list[Any]) -> tuple[int, tuple[ConsumerInfo, ...]]:
    rows = reply[1:]
    infos = tuple(
        ConsumerInfo(
            name=ConsumerName(_text(rows[i])),
            pending=int(rows[i + 1]),
            idle_ms=int(rows[i + 2]),
            inactive_ms=int(rows[i + 3]) if int(rows[i + 3]) >= 0 else None,
        )
        for i in range(0, len(rows), 4)
    )
    return int(reply[0]), infos


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
