"""The Redis Streams adapter against real servers: Redis 6.2 (embedded) and 7.x (CI)."""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis

from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import ConsumerName, GroupInfo, GroupName, PendingEntry, StreamKey
from tests import redis_kit

from .helpers import fill, idle_at_least, owners, read, register

S, G = StreamKey("rig:dispatch"), GroupName("workers")


async def test_resolve_streams_by_name_and_pattern(
    any_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(any_redis, "rig:dispatch", "g", 1)
    await fill(any_redis, "assignments:dev-e", "g", 1)
    await fill(any_redis, "assignments:review-e", "g", 1)
    await any_redis.xadd("assignments:dev-e:dlq", {"x": "1"})
    await any_redis.set("assignments:not-a-stream", "x")
    await any_redis.set("plain", "x")
    with caplog.at_level(logging.INFO):
        found = await redis_streams.resolve_streams(
            any_redis, names=["rig:dispatch", "assignments:*", "missing", "plain"]
        )
    assert sorted(found) == ["assignments:dev-e", "assignments:review-e", "rig:dispatch"]
    assert "Stream missing skipped: no such key" in caplog.text
    assert "Stream plain skipped: a string, not a stream" in caplog.text


async def test_describe_groups_reads_every_group_and_consumer(any_redis: Redis) -> None:
    await fill(any_redis, S, G, 5)
    await fill(any_redis, S, "audit", 0)
    await read(any_redis, S, G, "a-0", 3)
    await register(any_redis, S, G, "b-0")
    groups = {g.name: g for g in await redis_streams.describe_groups(any_redis, streams=[S])}
    assert set(groups) == {"workers", "audit"}
    workers = groups["workers"]
    assert workers.pending == 3
    by_name = {c.name: c for c in workers.consumers}
    assert by_name["a-0"].pending == 3 and by_name["b-0"].pending == 0
    assert all(c.idle_ms >= 0 for c in workers.consumers)
    version = (await any_redis.info("server"))["redis_version"]
    if tuple(int(p) for p in version.split(".")[:2]) >= (7, 2):
        assert by_name["a-0"].inactive_ms is not None
    else:
        assert by_name["a-0"].inactive_ms is None  # no `inactive` before 7.2
    assert groups["audit"].consumers == ()


async def test_a_summary_lists_the_holders_and_a_few_others_and_counts_them_all(
    any_redis: Redis,
) -> None:
    await fill(any_redis, S, G, 6)
    await fill(any_redis, S, "audit", 0)
    for n in range(30):
        await register(any_redis, S, G, f"quiet-{n:02}")
    await read(any_redis, S, G, "z-holder", 4)
    await read(any_redis, S, G, "m-holder", 2)
    summed = {
        g.name: g for g in await redis_streams.describe_groups(any_redis, streams=[S], others=3)
    }
    workers = summed["workers"]
    assert (workers.consumer_count, workers.complete, workers.pending) == (32, False, 6)
    # Every holder, wherever it sorts; of the others, the first three by name.
    assert [(c.name, c.pending) for c in workers.consumers] == [
        ("m-holder", 2),
        ("quiet-00", 0),
        ("quiet-01", 0),
        ("quiet-02", 0),
        ("z-holder", 4),
    ]
    assert all(c.idle_ms >= 0 for c in workers.consumers)
    assert workers.oldest_id is not None and workers.oldest_idle_ms is not None
    full = {g.name: g for g in await redis_streams.describe_groups(any_redis, streams=[S])}
    assert full["workers"].complete and full["workers"].consumer_count == 32
    assert {c.name: c.inactive_ms for c in workers.consumers} == {
        c.name: c.inactive_ms for c in full["workers"].consumers if c.name in summed_names(workers)
    }
    assert (summed["audit"].consumer_count, summed["audit"].complete) == (0, True)
    # One group of the stream read alone (a group's page, a move by hand).
    [only] = await redis_streams.describe_groups(any_redis, streams=[S], only=G)
    assert (only.name, only.consumer_count) == (G, 32)


def summed_names(group: GroupInfo) -> set[str]:
    return {c.name for c in group.consumers}


async def test_describe_groups_skips_a_stream_that_vanished(
    any_redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(any_redis, S, G, 1)
    with caplog.at_level(logging.INFO):
        groups = await redis_streams.describe_groups(any_redis, streams=[S, StreamKey("gone")])
    assert [g.stream for g in groups] == [S]
    assert "Stream gone skipped" in caplog.text


async def test_pending_entries_pages_the_whole_list(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 250)
    await read(any_redis, S, G, "a-0", 120)
    await read(any_redis, S, G, "b-0", 100)
    await read(any_redis, S, G, "c-0", 30)
    entries = await redis_kit.pending_entries(
        any_redis,
        stream=S,
        group=G,
        min_idle_ms={ConsumerName("a-0"): 0, ConsumerName("b-0"): 0},
        page_size=7,
    )
    assert [e.id for e in entries if e.consumer == "a-0"] == ids[:120]
    assert [e.id for e in entries if e.consumer == "b-0"] == ids[120:220]
    assert {e.consumer for e in entries} == {"a-0", "b-0"}  # c-0 was not asked for
    assert all(e.deliveries == 1 for e in entries)


async def test_pending_entries_filters_by_idle(any_redis: Redis) -> None:
    await fill(any_redis, S, G, 4)
    await read(any_redis, S, G, "a-0", 2)
    await idle_at_least(any_redis, S, G, 250)
    await read(any_redis, S, G, "a-0", 2)
    entries = await redis_kit.pending_entries(
        any_redis, stream=S, group=G, min_idle_ms={ConsumerName("a-0"): 200}
    )
    assert len(entries) == 2
    assert all(e.idle_ms >= 200 for e in entries)


async def test_pending_entries_of_a_vanished_group_are_skipped(any_redis: Redis) -> None:
    await fill(any_redis, S, G, 1)
    entries = await redis_kit.pending_entries(
        any_redis, stream=S, group=GroupName("nope"), min_idle_ms={ConsumerName("a-0"): 0}
    )
    assert entries == []


async def _pending(redis: Redis, consumer: str, min_idle: int = 0) -> list[PendingEntry]:
    return await redis_kit.pending_entries(
        redis, stream=S, group=G, min_idle_ms={ConsumerName(consumer): min_idle}
    )


async def _sweep(redis: Redis, target: str, owner: str) -> list[str]:
    """Everything `owner` holds, read page by page and claimed to `target`; the ids moved."""
    moved: list[str] = []
    request: redis_sweep.PageRequest | None = redis_sweep.PageRequest(0, "-")
    while request is not None:
        pages = await redis_sweep.read_pages(
            redis, stream=S, group=G, pages={ConsumerName(owner): request}
        )
        page = pages[ConsumerName(owner)]
        least = min((e.idle_ms for e in page.entries), default=0)
        batch = redis_writes.ClaimBatch(ConsumerName(target), least, [e.id for e in page.entries])
        [claimed] = await redis_writes.claim(redis, stream=S, group=G, batches=[batch])
        moved += claimed
        request = None if page.next_start is None else redis_sweep.PageRequest(0, page.next_start)
    return moved


async def test_sweep_moves_entries_without_raising_delivery_count(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 2500)
    await read(any_redis, S, G, "a-0", 2500)
    await register(any_redis, S, G, "b-0")
    await idle_at_least(any_redis, S, G, 20)  # the guard a claim carries is above 0
    assert sorted(await _sweep(any_redis, "b-0", "a-0")) == sorted(ids)
    assert set((await owners(any_redis, S, G)).values()) == {"b-0"}
    assert {e.deliveries for e in await _pending(any_redis, "b-0")} == {1}


async def test_sweep_tolerates_trimmed_entries(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 3)
    await read(any_redis, S, G, "a-0", 3)
    await register(any_redis, S, G, "b-0")
    await any_redis.xdel(S, ids[1])
    moved = await _sweep(any_redis, "b-0", "a-0")
    assert ids[0] in moved and ids[2] in moved
    # Redis 7 drops a deleted entry from the pending list on XCLAIM; 6.2 moves it like any other.
    assert ids[1] not in (await owners(any_redis, S, G)) or ids[1] in moved


async def test_dead_letter_copies_with_diagnostics_and_acks(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 2)
    await read(any_redis, S, G, "a-0", 2)
    await idle_at_least(any_redis, S, G, 20)  # the guard a claim carries is above 0
    entries = [e for e in await _pending(any_redis, "a-0") if e.id == ids[0]]
    done = await redis_writes.dead_letter(
        any_redis, stream=S, group=G, entries=entries, reason="max-deliveries"
    )
    assert [(d.entry_id, d.deliveries, d.issue_id) for d in done] == [(ids[0], 1, "rc-1")]
    [(dlq_id, fields)] = await any_redis.xrange(f"{S}:dlq")
    assert dlq_id == done[0].dlq_id
    assert fields == {
        "originalId": ids[0],
        "stream": S,
        "group": G,
        "consumer": "a-0",
        "deliveries": "1",
        "reason": "max-deliveries",
        "type": "ISSUE_ASSIGNED",
        "issueId": "rc-1",
        "payload": "{}",
    }
    assert await owners(any_redis, S, G) == {ids[1]: "a-0"}  # acked on the source, the other kept


async def test_dead_letter_is_guarded_like_a_claim(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 1)
    await read(any_redis, S, G, "a-0", 1)
    await idle_at_least(any_redis, S, G, 300)
    seen = await _pending(any_redis, "a-0", min_idle=250)
    await any_redis.xclaim(S, G, "b-0", min_idle_time=0, message_ids=ids, justid=True)
    assert (
        await redis_writes.dead_letter(any_redis, stream=S, group=G, entries=seen, reason="r") == []
    )
    assert await any_redis.exists(f"{S}:dlq") == 0
    assert await owners(any_redis, S, G) == {ids[0]: "b-0"}


async def test_dead_letter_of_a_trimmed_entry_says_so(any_redis: Redis) -> None:
    ids = await fill(any_redis, S, G, 1)
    await read(any_redis, S, G, "a-0", 1)
    await any_redis.xdel(S, ids[0])
    entries = await _pending(any_redis, "a-0")
    done = await redis_writes.dead_letter(
        any_redis, stream=S, group=G, entries=entries, reason="max-deliveries"
    )
    assert [d.issue_id for d in done] == [None]
    [(_, fields)] = await any_redis.xrange(f"{S}:dlq")
    assert fields["reason"] == "max-deliveries; entry no longer in the stream"
    assert await owners(any_redis, S, G) == {}
