"""The quiet fleet of `bench/scale.py`: 1,000 agents heartbeating, 1,000 groups over 100 streams,
N consumers spread over the groups (none holding anything but one consumer in each stream's
first group: 5 entries, and one consumer in each group of the dispatch stream: the long story's
entry), every agent and consumer with a fresh heartbeat row, and a work history in the event log
(`bench/scale_work.py`). Nothing is stale and nobody is down: a scan moves nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from redis.asyncio import Redis

import harness
import scale_work
from harness import TENANT, BenchError, Stores
from scale_work import Place, Story, Worker

AGENTS, STREAMS, GROUPS = 1_000, 100, 1_000
PENDING_PER_STREAM = 5  # entries delivered to one consumer of each stream's first group
PIPELINE = 10_000  # commands per pipeline
PREFIX = "scale:"  # RIG_STREAMS=scale:*
DISPATCH_STREAM = f"{PREFIX}00"  # RIG_DISPATCH_STREAM: group number 0's stream
STORY_HELD = GROUPS // STREAMS  # the long story's entry, held in every group of its stream
MIN_CONSUMERS = 2 * GROUPS  # two in each group: a reclaim needs a consumer to move to
CONSUMER_NAME = re.compile(r"agent-\d{4}-rig-agent-runtime-\d+")  # any consumer's name


@dataclass(frozen=True)
class Fleet:
    """`consumers` consumers: number i is `<agent>-rig-agent-runtime-<i // GROUPS>` in group
    `i % GROUPS`, its agent shifted by `i // GROUPS` so each group has consumers of many agents
    (names are unique: the agent and the suffix give i back)."""

    consumers: int

    @staticmethod
    def agent(n: int) -> str:
        return f"agent-{n:04d}"

    @staticmethod
    def group(g: int) -> tuple[str, str]:
        """Group number `g` as (stream, group name): 10 groups a stream."""
        return f"{PREFIX}{g % STREAMS:02d}", f"g{g // STREAMS}"

    def consumer(self, i: int) -> tuple[str, str, int]:
        """Consumer number `i`: (its agent, its name, its group number)."""
        g, round_ = i % GROUPS, i // GROUPS
        agent = self.agent((g + round_) % AGENTS)
        return agent, f"{agent}-rig-agent-runtime-{round_}", g

    def all(self) -> Iterator[tuple[str, str, int]]:
        return (self.consumer(i) for i in range(self.consumers))

    def holder(self, stream_n: int) -> tuple[str, str, str]:
        """(stream, group, consumer): who holds the pending entries of stream `stream_n`."""
        stream, group = self.group(stream_n)
        return stream, group, self.consumer(stream_n)[1]

    def worker(self, i: int) -> Worker:
        agent, name, g = self.consumer(i)
        return Worker(self.group(g)[1], name, agent)

    @property
    def rounds(self) -> int:
        """Consumers every group has (some have one more)."""
        return self.consumers // GROUPS

    def story_holders(self) -> tuple[list[Worker], Worker]:
        """Who holds the long story's entry in each group of the dispatch stream (the first is
        `holder(0)`), and the consumer of the first group it was moved away from."""
        holders = [self.worker(g) for g in range(0, GROUPS, STREAMS)]
        return holders, self.worker(GROUPS)

    def place(self, n: int) -> Place:
        """Finished issue `n`: every other one dispatched, the rest entries others appended to
        the other streams; worked in the stream's first group, by its consumers in turn."""
        dispatched = n % 2 == 0
        g = 0 if dispatched else 1 + n % (STREAMS - 1)
        r = (n // STREAMS) % self.rounds
        worker, other = (
            self.worker(g + GROUPS * r),
            self.worker(g + GROUPS * ((r + 1) % self.rounds)),
        )
        return Place(self.group(g)[0], worker, other, dispatched)

    @property
    def pending(self) -> int:
        return STREAMS * PENDING_PER_STREAM + STORY_HELD


@dataclass(frozen=True)
class DataSet:
    seconds: float  # to build it
    story: Story
    history: int  # event rows of the finished issues


async def build(stores: Stores, fleet: Fleet) -> DataSet:
    """A fresh data set (FLUSHDB, TRUNCATE): its Redis side, the work history and the heartbeat
    rows. The finished work is logged first, as it happened first; the long story's entry is
    appended before the other entries, so each group of its stream reads it first."""
    if fleet.consumers < MIN_CONSUMERS:
        raise BenchError(f"{fleet.consumers:,} consumers: the data set needs {MIN_CONSUMERS:,}")
    started = time.perf_counter()
    await stores.reset()
    await _groups(stores.redis)
    await _consumers(stores.redis, fleet)
    url = stores.servers.database_url
    before = datetime.now(UTC) - timedelta(hours=1)
    history = await scale_work.history(
        url, issues=scale_work.HISTORY, place=fleet.place, before=before
    )
    holders, zombie = fleet.story_holders()
    story = await scale_work.story(stores, stream=DISPATCH_STREAM, holders=holders, zombie=zombie)
    await _pending(stores.redis, fleet)
    await scale_work.analyze(url)
    await _heartbeat_rows(url, fleet)
    return DataSet(time.perf_counter() - started, story, history)


async def _groups(redis: Redis) -> None:
    async with redis.pipeline(transaction=False) as pipe:
        for g in range(GROUPS):
            stream, group = Fleet.group(g)
            pipe.xgroup_create(stream, group, id="$", mkstream=True)
        await pipe.execute()


async def _consumers(redis: Redis, fleet: Fleet) -> None:
    """XGROUP CREATECONSUMER for every consumer, PIPELINE commands a round trip."""
    for start in range(0, fleet.consumers, PIPELINE):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(fleet.consumers, start + PIPELINE)):
                _, name, g = fleet.consumer(i)
                pipe.xgroup_createconsumer(*Fleet.group(g), name)
            await pipe.execute()


async def _pending(redis: Redis, fleet: Fleet) -> None:
    """PENDING_PER_STREAM entries per stream, read by one consumer of its first group (the other
    groups, created at `$` before them, see them as lag)."""
    for n in range(STREAMS):
        stream, _ = Fleet.group(n)
        await harness.add_entries(redis, stream, PENDING_PER_STREAM)
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(STREAMS):
            stream, group, consumer = fleet.holder(n)
            pipe.xreadgroup(group, consumer, {stream: ">"}, count=PENDING_PER_STREAM)
        read = sum(len(reply[0][1]) for reply in await pipe.execute())
    if read != STREAMS * PENDING_PER_STREAM:
        raise BenchError(f"delivered {read} entries, expected {STREAMS * PENDING_PER_STREAM}")


async def _heartbeat_rows(database_url: str, fleet: Fleet) -> None:
    """One agent_heartbeats row per agent, one consumer_heartbeats row per consumer, by COPY."""
    now = datetime.now(UTC)
    columns = "tenant, agent_id, last_heartbeat_at, heard_since, beats"
    async with await psycopg.AsyncConnection.connect(harness.conninfo(database_url)) as conn:
        async with conn.cursor() as cur:
            sql = f"COPY agent_heartbeats ({columns}) FROM STDIN"
            async with cur.copy(sql) as copy:
                for n in range(AGENTS):
                    await copy.write_row((TENANT, Fleet.agent(n), now, now, 1))
            sql = f"COPY consumer_heartbeats (consumer, {columns}) FROM STDIN"
            async with cur.copy(sql) as copy:
                for agent, name, _ in fleet.all():
                    await copy.write_row((name, TENANT, agent, now, now, 1))
        await conn.commit()


async def refresh(database_url: str) -> None:
    """Every heartbeat row heard now, every running attempt's progress too: nobody looks down,
    and nothing stalled, to the measurement that follows."""
    async with await psycopg.AsyncConnection.connect(harness.conninfo(database_url)) as conn:
        await conn.execute("UPDATE agent_heartbeats SET last_heartbeat_at = now()")
        await conn.execute("UPDATE consumer_heartbeats SET last_heartbeat_at = now()")
        for table in ("assignments", "group_assignments"):
            await conn.execute(f"UPDATE {table} SET progress_at = now() WHERE state = 'running'")
        await conn.commit()
