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

from rig_conductor.adapters.redis import lua
from rig_conductor.adapters.redis.client import raise_moved
from rig_conductor.domain import ConsumerInfo, ConsumerName, GroupName, StreamKey


async def summaries(
    client: Redis, groups: Sequence[tuple[StreamKey, GroupName]], *, others: int
) -> list[tuple[int, tuple[ConsumerInfo, ...]] | Exception]:
    """Per group, in order: (how many consumers, the holders and the first `others` others), or
    the error Redis answered for it (a slot that moved is raised: the caller retries)."""
    if not groups:
        return []
    script = client.register_script(lua.CONSUMER_SUMMARY)
    async with client.pipeline(transaction=False) as pipe:
        for stream, group in groups:
            await script(keys=[stream], args=[group, others], client=pipe)
        replies = await pipe.execute(raise_on_error=False)
    raise_moved(replies)
    found: list[tuple[int, tuple[ConsumerInfo, ...]] | Exception] = []
    for reply in replies:
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
