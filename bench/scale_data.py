"""The quiet fleet of `bench/scale.py`: 1,000 agents heartbeating, 1,000 groups over 100 streams,
N consumers spread over the groups (none holding anything but one consumer in each stream's
first group: 5 entries), every agent and consumer with a fresh heartbeat row. Nothing is stale
and nobody is down: a scan moves nothing.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
from redis.asyncio import Redis

import harness
from harness import TENANT, Stores

AGENTS, STREAMS, GROUPS = 1_000, 100, 1_000
PENDING_PER_STREAM = 5  # entries delivered to one consumer of each stream's first group
PIPELINE = 10_000  # commands per pipeline
PREFIX = "scale:"  # RIG_STREAMS=scale:*
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

    @property
    def pending(self) -> int:
        return STREAMS * PENDING_PER_STREAM if self.consumers >= STREAMS else 0


async def build(stores: Stores, fleet: Fleet) -> float:
    """A fresh data set (FLUSHDB, TRUNCATE), its Redis side and heartbeat rows: the seconds."""
    started = time.perf_counter()
    await stores.reset()
    await _groups(stores.redis)
    await _consumers(stores.redis, fleet)
    await _pending(stores.redis, fleet)
    await _heartbeat_rows(stores.servers.database_url, fleet)
    return time.perf_counter() - started


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
    if not fleet.pending:
        return
    for n in range(STREAMS):
        stream, _ = Fleet.group(n)
        await harness.add_entries(redis, stream, PENDING_PER_STREAM)
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(STREAMS):
            stream, group, consumer = fleet.holder(n)
            pipe.xreadgroup(group, consumer, {stream: ">"}, count=PENDING_PER_STREAM)
        read = sum(len(reply[0][1]) for reply in await pipe.execute())
    if read != fleet.pending:
        raise harness.BenchError(f"delivered {read} entries, expected {fleet.pending}")


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
    """Every heartbeat row heard now: nobody looks down to the measurement that follows."""
    async with await psycopg.AsyncConnection.connect(harness.conninfo(database_url)) as conn:
        await conn.execute("UPDATE agent_heartbeats SET last_heartbeat_at = now()")
        await conn.execute("UPDATE consumer_heartbeats SET last_heartbeat_at = now()")
        await conn.commit()
