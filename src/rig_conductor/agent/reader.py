"""Reading one consumer group as one consumer: join it, read pending and new entries one at a
time, page through its pending ids without reading them, and look up an entry's delivery count.
Redis I/O only; what to do with an entry is the runtime's business."""

from __future__ import annotations

import logging
from collections.abc import Container
from typing import Any

from redis.exceptions import ResponseError

from rig_conductor.adapters.redis.client import AnyRedis

logger = logging.getLogger(__name__)

Read = tuple[str, dict[str, str]]  # (entry id, fields); a deleted entry comes with no fields


class GroupReader:
    def __init__(self, redis: AnyRedis, *, stream: str, group: str, consumer: str) -> None:
        self._redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer

    async def join(self, start_id: str) -> None:
        """Create the group lazily (BUSYGROUP is fine), then register this consumer, so it is a
        reclaim target before it has read anything."""
        try:
            await self._redis.xgroup_create(self.stream, self.group, id=start_id, mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            logger.info("Created group %s on %s from %s", self.group, self.stream, start_id)
        await self._redis.xgroup_createconsumer(self.stream, self.group, self.consumer)

    async def pending_after(self, cursor: str) -> list[Read]:
        """`XREADGROUP ... <cursor>`: the next of this consumer's own pending entries (where
        reclaimed ones land). One at a time: a read counts as a delivery."""
        reply = await self._redis.xreadgroup(
            self.group, self.consumer, {self.stream: cursor}, count=1
        )
        return _entries(reply)

    async def pending_ids(self, *, after: str, count: int) -> list[str]:
        """Ids of this consumer's pending entries after `after` ('-' for all), without reading
        them: XPENDING does not count as a delivery, where XREADGROUP does."""
        start = "-" if after in ("-", "0") else "(" + after
        rows = await self._redis.xpending_range(
            self.stream, self.group, min=start, max="+", count=count, consumername=self.consumer
        )
        return [str(row["message_id"]) for row in rows]

    async def cursor_skipping(self, skip: Container[str], cursor: str) -> str:
        """A cursor just before this consumer's next pending entry after `cursor` that is not
        in `skip`; '' when there is none. Reads ids only, so nothing skipped is delivered."""
        after = cursor
        while True:
            ids = await self.pending_ids(after=after, count=100)
            for entry_id in ids:
                if entry_id not in skip:
                    return _before(entry_id)
            if len(ids) < 100:
                return ""
            after = ids[-1]

    async def all_pending_ids(self) -> set[str]:
        """The ids of every entry pending for this consumer, read a thousand at a time."""
        mine: set[str] = set()
        after = "-"
        while True:
            ids = await self.pending_ids(after=after, count=1000)
            mine.update(ids)
            if len(ids) < 1000:
                return mine
            after = ids[-1]

    async def new(self, block_ms: int) -> list[Read]:
        reply = await self._redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=1, block=block_ms
        )
        return _entries(reply)

    async def deliveries(self, entry_id: str) -> int | None:
        """The entry's delivery count, None when it is no longer pending for this consumer."""
        rows = await self._redis.xpending_range(
            self.stream,
            self.group,
            min=entry_id,
            max=entry_id,
            count=1,
            consumername=self.consumer,
            idle=0,
        )
        return int(rows[0]["times_delivered"]) if rows else None


def _before(entry_id: str) -> str:
    """The greatest stream id below `entry_id`: reading after it starts at `entry_id`."""
    ms, _, seq = entry_id.partition("-")
    if int(seq or 0) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-18446744073709551615" if int(ms) > 0 else "0"


def _entries(reply: Any) -> list[Read]:
    return [
        (entry_id, dict(fields or {})) for _, batch in reply or [] for entry_id, fields in batch
    ]
