"""Redis helpers the tests and the benchmarks share, kept out of src/ because nothing the
conductor runs needs them: a plain client for one server by URL (the conductor connects per
topology, `redis_client.connect`), and whole pending lists (the reaper reads a page at a time,
`redis_sweep.read_pages`)."""

from __future__ import annotations

from collections.abc import Mapping

from redis.asyncio import Redis

from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.adapters.redis.client import redis_client_retry
from rig_conductor.domain import ConsumerName, GroupName, PendingEntry, StreamKey

PAGE_SIZE = 10_000  # XPENDING rows per call


def connect(url: str) -> Redis:
    """A client for one standalone Redis named by URL: text replies, bounded waits, retries on
    blips, as the conductor's own clients."""
    return Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=5,
        health_check_interval=30,
        retry=redis_client_retry(),
    )


async def pending_entries(
    client: Redis,
    *,
    stream: StreamKey,
    group: GroupName,
    min_idle_ms: Mapping[ConsumerName, int],
    page_size: int = PAGE_SIZE,
) -> list[PendingEntry]:
    """The whole pending list of each named consumer, idle at least its `min_idle_ms`.

    Pages with exclusive ranges (`(last-id`) so there is no 100-entry cap; every consumer's
    next page goes out in the same round trip (`redis_sweep.read_pages`).
    """
    entries: list[PendingEntry] = []
    requests = {c: redis_sweep.PageRequest(idle, "-") for c, idle in min_idle_ms.items()}
    while requests:
        pages = await redis_sweep.read_pages(
            client, stream=stream, group=group, pages=requests, count=page_size
        )
        for page in pages.values():
            entries.extend(page.entries)
        requests = {
            c: redis_sweep.PageRequest(requests[c].min_idle_ms, page.next_start)
            for c, page in pages.items()
            if page.next_start is not None
        }
    return entries
