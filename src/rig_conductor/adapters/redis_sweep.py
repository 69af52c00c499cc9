"""The reaper's moves in Redis: sort a page of an owner's pending list by its rule, server-side,
then claim stretches of it for targets with guarded XCLAIMs.

Thin: parameters in, domain objects out. Which entries qualify and where they go are
`policy.reclaim`'s decisions, stated here as a rule's parameters and as claim batches.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from rig_conductor.domain import ConsumerName, EntryId, GroupName, PendingEntry, StreamKey

logger = logging.getLogger(__name__)


# One page of an owner's entry rule, applied where the pending list lives: read the page with
# XPENDING IDLE and sort it into entries to move and entries worn out (for the dead-letter path)
# without shipping the rest out. The moves themselves are XCLAIMs with the least idle time seen
# here as min-idle (`claim`), so an entry touched in between stays where it is.
# KEYS: stream. ARGV: group, owner, min-idle, max-deliveries, start ('-' or '(<id>'), count,
#       then three id sets, each as its size and its ids: worn (recorded attempts), keep (never
#       qualify), due (qualify at any idle time). With due ids the page is read at any idle.
# Returns {movable ids, least idle among them, {id, idle, deliveries, ...} worn, last id read,
#          rows read}.
_SWEEP_LUA = """
local at, sets = 7, {}
for s = 1, 3 do
  local set, n = {}, tonumber(ARGV[at])
  for i = at + 1, at + n do set[ARGV[i]] = true end
  sets[s] = set
  at = at + n + 1
end
local worn, keep, due = sets[1], sets[2], sets[3]
local min_idle, max_deliveries = tonumber(ARGV[3]), tonumber(ARGV[4])
local filter = min_idle
if next(due) ~= nil then filter = 0 end
local rows = redis.call('XPENDING', KEYS[1], ARGV[1], 'IDLE', filter,
                        ARGV[5], '+', tonumber(ARGV[6]), ARGV[2])
local movable, dead, least = {}, {}, nil
for _, row in ipairs(rows) do
  local id, idle = row[1], row[3]
  if due[id] or (idle >= min_idle and not keep[id]) then
    if row[4] >= max_deliveries or worn[id] then
      table.insert(dead, id); table.insert(dead, idle); table.insert(dead, row[4])
    else
      table.insert(movable, id)
      if least == nil or idle < least then least = idle end
    end
  end
end
local last = ''
if #rows > 0 then last = rows[#rows][1] end
return {movable, least or 0, dead, last, #rows}
"""
SWEEP_PAGE = 1_000  # entries per script call: about a millisecond of Redis time


@dataclass(frozen=True, slots=True)
class SweepRule:
    """Which entries of `owner` qualify and which of those are worn out (`OwnerRule`'s terms)."""

    owner: ConsumerName
    min_idle_ms: int
    max_deliveries: int
    worn: Collection[str] = ()
    keep: Collection[str] = ()
    due: Collection[str] = ()

    def args(self, start: str, count: int) -> list[str | int]:
        args: list[str | int] = [self.owner, self.min_idle_ms, self.max_deliveries, start, count]
        for ids in (self.worn, self.keep, self.due):
            args += [len(ids), *ids]
        return args


@dataclass(frozen=True, slots=True)
class SweptPage:
    """One page of an owner's pending list, sorted by its rule."""

    movable: list[EntryId]
    least_idle_ms: int
    worn: list[PendingEntry]
    next_start: str | None  # where the next page starts; None at the end of the list


async def sweep_pages(
    client: Redis,
    *,
    stream: StreamKey,
    group: GroupName,
    pages: Mapping[ConsumerName, tuple[SweepRule, str]],
    page_size: int = SWEEP_PAGE,
) -> dict[ConsumerName, SweptPage]:
    """Sort the next page of each owner's pending list (rule, start) in one round trip.

    An owner whose page Redis refused (the group or stream is gone) is logged and left out.
    """
    script = client.register_script(_SWEEP_LUA)
    async with client.pipeline(transaction=False) as pipe:
        for rule, start in pages.values():
            await script(keys=[stream], args=[group, *rule.args(start, page_size)], client=pipe)
        replies = await pipe.execute(raise_on_error=False)
    sorted_pages: dict[ConsumerName, SweptPage] = {}
    for owner, reply in zip(pages, replies, strict=True):
        if isinstance(reply, ResponseError):
            logger.info("Pending list of %s in %s/%s skipped: %s", owner, stream, group, reply)
            continue
        movable, least, worn, last, read = reply
        sorted_pages[owner] = SweptPage(
            movable,
            int(least),
            [
                PendingEntry(EntryId(worn[i]), owner, int(worn[i + 1]), int(worn[i + 2]))
                for i in range(0, len(worn), 3)
            ],
            "(" + last if read == page_size else None,
        )
    return sorted_pages


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
    delivery count. On Redis 7 an entry trimmed from the stream is dropped, not moved.
    """
    if not batches:
        return []
    async with client.pipeline(transaction=False) as pipe:
        for batch in batches:
            pipe.xclaim(
                stream, group, batch.target, batch.min_idle_ms, list(batch.ids), justid=True
            )
        replies = await pipe.execute(raise_on_error=False)
    moved: list[list[EntryId]] = []
    for batch, reply in zip(batches, replies, strict=True):
        if isinstance(reply, ResponseError):
            logger.info("Claim to %s in %s/%s failed: %s", batch.target, stream, group, reply)
            moved.append([])
        else:
            moved.append(reply)
    return moved
