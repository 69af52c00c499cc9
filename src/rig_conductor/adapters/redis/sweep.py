"""The reaper's reads for its moves in Redis: pages of owners' pending lists (the guarded
XCLAIMs that move stretches of them are `writes.claim`'s).

Thin: parameters in, domain objects out. Which entries qualify and where they go are
`policy.reclaim`'s decisions; the only filter applied here is the idle time a page is read
with (XPENDING IDLE), below which no entry of that owner can qualify.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NamedTuple

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError

from rig_conductor import logs
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.domain import ConsumerName, GroupName, PendingEntry, StreamKey

logger = logging.getLogger(logs.SWEEP_LOGGER)

PAGE = 1_000  # entries per owner and read: about a millisecond of Redis time


class PageRequest(NamedTuple):
    """The next page of one owner's pending list: entries idle at least `min_idle_ms`, from
    `start` (`-`, or `(<id>` for after that id)."""

    min_idle_ms: int
    start: str


class Page(NamedTuple):
    entries: list[PendingEntry]
    next_start: str | None  # where the next page starts; None at the end of the list


async def read_pages(
    client: Redis,
    *,
    stream: StreamKey,
    group: GroupName,
    pages: Mapping[ConsumerName, PageRequest],
    count: int = PAGE,
) -> dict[ConsumerName, Page]:
    """The next page of each owner's pending list, in one round trip (XPENDING ... IDLE).

    An owner whose page Redis refused (the group or stream is gone) is logged and left out; a
    slot that moved is raised (`redis_client.raise_moved`), for the caller's retry.
    """
    async with _raw_pipeline(client) as pipe:
        for owner, request in pages.items():
            pipe.execute_command(
                "XPENDING", stream, group, "IDLE", request.min_idle_ms, request.start, "+",
                count, owner,
            )  # fmt: skip
        replies = await pipe.execute(raise_on_error=False)
    redis_client.raise_moved(replies)
    read: dict[ConsumerName, Page] = {}
    for owner, reply in zip(pages, replies, strict=True):
        if isinstance(reply, ResponseError):
            logger.info("Pending list of %s in %s/%s skipped: %s", owner, stream, group, reply)
            continue
        # A row is [id, consumer, idle ms, deliveries]: PendingEntry's own order.
        entries = list(map(PendingEntry._make, reply))
        last = entries[-1].id if len(entries) == count else None
        read[owner] = Page(entries, None if last is None else "(" + last)
    return read


def _raw_pipeline(client: Redis) -> Pipeline:
    """A pipeline on `client`'s connections whose replies are left as Redis sends them (no
    response callbacks): a page is read without building a dict per entry."""
    return Pipeline(client.connection_pool, {}, transaction=False, shard_hint=None)
