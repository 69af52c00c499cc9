"""Small builders for stream fixtures: dispatch entries and let consumers read them."""

from __future__ import annotations

from redis.asyncio import Redis


async def fill(redis: Redis, stream: str, group: str, n: int, *, start: int = 1) -> list[str]:
    """Create `group` (MKSTREAM) if needed and append n ISSUE_ASSIGNED-like entries."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception as exc:  # BUSYGROUP: already there
        if "BUSYGROUP" not in str(exc):
            raise
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(start, start + n):
            pipe.xadd(stream, {"type": "ISSUE_ASSIGNED", "issueId": f"rc-{i}", "payload": "{}"})
        return list(await pipe.execute())


async def read(redis: Redis, stream: str, group: str, consumer: str, count: int) -> list[str]:
    """`consumer` reads up to `count` new entries (they join its pending list)."""
    replies = await redis.xreadgroup(group, consumer, {stream: ">"}, count=count)
    return [entry_id for _, entries in replies for entry_id, _ in entries]


async def register(redis: Redis, stream: str, group: str, consumer: str) -> None:
    await redis.xgroup_createconsumer(stream, group, consumer)


async def owners(redis: Redis, stream: str, group: str) -> dict[str, str]:
    """entry id -> owning consumer, for the whole pending list."""
    rows = await redis.xpending_range(stream, group, min="-", max="+", count=1_000_000)
    return {row["message_id"]: row["consumer"] for row in rows}
