"""A consumer group's lag: the entries of its stream not yet delivered to it.

Redis 7 says it in XINFO GROUPS (`lag`), except after deletions it cannot account for; Redis
6.2 never does. There the entries after the group's last-delivered id are counted inside Redis,
up to a cap, so a scan's cost stays bounded whatever the backlog.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from rig_conductor.adapters.redis import lua
from rig_conductor.adapters.redis.client import raise_moved
from rig_conductor.domain import StreamKey

# Entries a group has not been delivered yet, counted where Redis does not say (6.2, or 7
# after deletions): at most this many, a thousand per XRANGE, inside Redis.
LAG_COUNT_CAP = 100_000


async def group_lags(
    client: Redis, groups: Sequence[tuple[StreamKey, Mapping[str, Any]]]
) -> list[int | None]:
    """Each group's lag (entries not yet delivered to it): XINFO GROUPS' own `lag` on Redis 7,
    else counted (up to `LAG_COUNT_CAP`); None where it cannot be had. A slot that moved is
    raised (`raise_moved`), for the caller's retry."""
    lags: list[int | None] = []
    counting: list[tuple[int, StreamKey, str]] = []
    for n, (stream, info) in enumerate(groups):
        lag = info.get("lag")
        lags.append(int(lag) if lag is not None else None)
        if lag is None and info.get("last-delivered-id") is not None:
            counting.append((n, stream, str(info["last-delivered-id"])))
    if not counting:
        return lags
    script = client.register_script(lua.GROUP_LAG)
    async with client.pipeline(transaction=False) as pipe:
        for _, stream, last in counting:
            await script(keys=[stream], args=[last, LAG_COUNT_CAP], client=pipe)
        replies = await pipe.execute(raise_on_error=False)
    raise_moved(replies)
    for (n, _, _), reply in zip(counting, replies, strict=True):
        lags[n] = None if isinstance(reply, Exception) else int(reply)
    return lags
