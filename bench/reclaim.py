"""Reclaim as users run it: `rig-conductor reap --once` as a subprocess at INFO, its stderr read
by this process through a pipe, in text and in JSON log format, against the XAUTOCLAIM COUNT 10
loop of the source design on the same data set in the same run.

    .venv/bin/python bench/reclaim.py            # 200,000 / 200 and 1,000,000 / 1,000
    .venv/bin/python bench/reclaim.py --quick    # 50,000 / 50, quiet scan on 1,000 consumers
    .venv/bin/python bench/reclaim.py --shapes 1000000/1000+1 --quiet-consumers 0

Each run gets a fresh data set (harness.plant): every entry held by a dead consumer (known
agent ids that never heartbeat), stale, and one live consumer to take them all. A run counts
only once verified: the dead consumers hold nothing, and the report, the [StreamReclaim] lines
read from stderr and the event log's RECLAIMED rows all count every stale entry. Also printed:
XCLAIM JUSTID of the same ids known beforehand (what the moves alone cost Redis). Secondary
lines: `reap_once` in this process at WARNING (no log lines at all), and the cost of a quiet
scan (nothing stale) with a million pending entries against a hundred.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

import harness
from harness import GROUP, TENANT, BenchError, Shape, Stores
from rig_conductor.adapters import redis_streams, redis_sweep
from rig_conductor.domain import ConsumerName, GroupName, StreamKey
from rig_conductor.reaper.cycle import reap_once
from rig_conductor.settings import Settings

STREAM = "bench:reclaim"
RECOVERY = "recovery-worker-01"  # the loop's claiming consumer
STALE_MS, AGENT_DOWN_MS = 1_000, 600_000
GOAL_RATE, GOAL_RATIO, GOAL_RSS_MB, GOAL_QUIET = 150_000, 2.0, 250, 1.5
QUIET_AGENTS = (*harness.LIVE_AGENTS, "review-e-codex", "dev-e-dotnet", "dev-e-python")
QUIET_ROUNDS = 5


def settings(stores: Stores, stream: str, agent_ids: str, stale_ms: int) -> Settings:
    return Settings(
        redis_url=stores.servers.redis_url,
        database_url=stores.servers.database_url,
        streams=(stream,),
        agent_ids=tuple(agent_ids.split(",")),
        entry_stale_ms=stale_ms,
        agent_down_ms=AGENT_DOWN_MS,
        tenant=TENANT,
        dry_run=False,
    )


async def verify(stores: Stores, shape: Shape, reported: int, lines: int) -> None:
    await harness.verify_moved(stores, shape, STREAM, to=set())
    recorded = await stores.reclaimed_rows()
    if not reported == lines == recorded == shape.stale:
        raise BenchError(
            f"{shape.stale:,} stale entries: the report says {reported:,} reclaimed, "
            f"{lines:,} lines read, {recorded:,} in the event log"
        )


async def autoclaim_loop(stores: Stores, shape: Shape) -> float:
    """The baseline: `XAUTOCLAIM <stream> g recovery-worker-01 <min-idle> <cursor> COUNT 10`
    until the cursor is back at 0-0. It only moves entries: no event log, no log line."""
    min_idle = 1_000
    await harness.plant(stores, shape, STREAM, min_idle)
    started = time.perf_counter()
    cursor, claimed = "0-0", 0
    while True:
        reply = await stores.redis.xautoclaim(
            STREAM, GROUP, RECOVERY, min_idle, start_id=cursor, count=10
        )
        cursor, claimed = reply[0], claimed + len(reply[1])
        if cursor == "0-0":
            break
    seconds = time.perf_counter() - started
    pel = await harness.verify_moved(stores, shape, STREAM, to={RECOVERY})
    if not claimed == pel.get(RECOVERY) == shape.stale:
        raise BenchError(f"the loop claimed {claimed:,} entries of {shape.stale:,} stale ones")
    return claimed / seconds


async def claim_floor(stores: Stores, shape: Shape) -> float:
    """What the moves alone cost Redis: the dead consumers' ids, read beforehand, claimed for
    the live consumer with XCLAIM ... JUSTID, 1,000 ids a command, pipelined."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    ids = await redis_streams.pending_entries(
        stores.redis,
        stream=StreamKey(STREAM),
        group=GroupName(GROUP),
        min_idle_ms={ConsumerName(c): 0 for _, c in shape.dead},
    )
    target = shape.live[0][1]
    started = time.perf_counter()
    async with stores.redis.pipeline(transaction=False) as pipe:
        for start in range(0, len(ids), 1_000):
            batch = [e.id for e in ids[start : start + 1_000]]
            pipe.xclaim(STREAM, GROUP, target, 0, batch, justid=True)
        moved = sum(len(reply) for reply in await pipe.execute())
    seconds = time.perf_counter() - started
    if moved != shape.stale:
        raise BenchError(f"XCLAIM moved {moved:,} of {shape.stale:,} entries")
    return moved / seconds


async def reap_cli(
    stores: Stores, shape: Shape, log_format: str
) -> tuple[float, harness.CliRun, dict[str, Any]]:
    """The headline: (entries/s of the whole command, its run, its scan report)."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    env = harness.conductor_env(
        stores.servers,
        streams=STREAM,
        agent_ids=shape.agent_ids,
        entry_stale_ms=STALE_MS,
        agent_down_ms=AGENT_DOWN_MS,
        tenant=TENANT,
        log_format=log_format,
    )
    run = await asyncio.to_thread(harness.run_cli, ["reap", "--once"], env)
    report = json.loads(run.stdout)
    await verify(stores, shape, int(report["reclaimed"]), run.lines)
    return shape.stale / run.seconds, run, report


async def reap_in_process(stores: Stores, shape: Shape) -> float:
    """Secondary: `reap_once` called in this process, rig_conductor logging at WARNING."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    logging.getLogger("rig_conductor").setLevel(logging.WARNING)
    started = time.perf_counter()
    report = await reap_once(
        redis=stores.redis,
        engine=stores.engine,
        settings=settings(stores, STREAM, shape.agent_ids, STALE_MS),
    )
    seconds = time.perf_counter() - started
    await verify(stores, shape, report.reclaimed, report.reclaimed)  # no lines at WARNING
    return report.reclaimed / seconds


async def measure_shape(stores: Stores, shape: Shape) -> None:
    print(f"\n{shape}: {shape.stale:,} stale entries", flush=True)
    loop = await autoclaim_loop(stores, shape)
    print(f"  {'XAUTOCLAIM COUNT 10 loop (baseline)':<40} {loop:>9,.0f} entries/s", flush=True)
    floor = await claim_floor(stores, shape)
    print(
        f"  {'XCLAIM JUSTID of known ids, pipelined':<40} {floor:>9,.0f} entries/s "
        f"{floor / loop:5.1f}x the loop  (Redis's own cost of the moves: no discovery, no log)",
        flush=True,
    )
    for log_format in ("text", "json"):
        rate, run, report = await reap_cli(stores, shape, log_format)
        checks = {
            "entries/s": rate >= GOAL_RATE,
            "ratio": rate / loop >= GOAL_RATIO,
            "RSS": run.rss_mb < GOAL_RSS_MB,
        }
        missed = [name for name, ok in checks.items() if not ok]
        print(
            f"  {'reap --once, INFO, ' + log_format + ' log':<40} {rate:>9,.0f} entries/s "
            f"{rate / loop:5.1f}x the loop  {run.seconds:6.2f} s  peak RSS {run.rss_mb:4.0f} MB  "
            f"{run.lines:,} lines  goals {'MISSED: ' + ', '.join(missed) if missed else 'met'}",
            flush=True,
        )
        for phase, ms in (report.get("phasesMs") or {}).items():
            print(f"      {phase:<34} {ms * 1000 / shape.stale:7.2f} µs/entry")
    rate = await reap_in_process(stores, shape)
    label = "reap_once in process, WARNING"
    print(f"  {label:<40} {rate:>9,.0f} entries/s {rate / loop:5.1f}x the loop  (secondary)")


async def quiet_scan(stores: Stores, consumers: int, big: int) -> None:
    """Nothing stale: `consumers` consumers of live, heartbeating agents, in two streams holding
    100 and `big` pending entries. The two cases' scans alternate (a warm-up round, then
    QUIET_ROUNDS), so load from elsewhere on the machine hits both alike."""
    await stores.reset()
    pairs = harness.consumers(QUIET_AGENTS, consumers)
    cases = {100: f"bench:quiet:{100}", big: f"bench:quiet:{big}"}
    for pending, stream in cases.items():
        await harness.add_entries(stores.redis, stream, pending)
        await stores.redis.xgroup_create(stream, GROUP, id="0")
        async with stores.redis.pipeline(transaction=False) as pipe:
            for _, consumer in pairs:
                pipe.xgroup_createconsumer(stream, GROUP, consumer)
            await pipe.execute()
        share = [pending * i // consumers for i in range(consumers + 1)]  # even, sums up
        reads = [(c, share[i + 1] - share[i]) for i, (_, c) in enumerate(pairs)]
        await harness.deliver(stores.redis, stream, reads)
    await harness.heartbeat(stores.engine, pairs)
    agents = ",".join(QUIET_AGENTS)
    runs: dict[int, list[float]] = {pending: [] for pending in cases}
    reads, original = 0, redis_sweep.read_pages

    async def counted(*args: Any, **kwargs: Any) -> Any:  # a pending list read
        nonlocal reads
        reads += 1
        return await original(*args, **kwargs)

    redis_sweep.read_pages = counted  # type: ignore[assignment]
    try:
        for round_ in range(QUIET_ROUNDS + 1):
            for pending, stream in cases.items():
                started = time.perf_counter()
                report = await reap_once(
                    redis=stores.redis,
                    engine=stores.engine,
                    settings=settings(stores, stream, agents, 300_000),
                )
                if report.reclaimed or report.consumers_down or report.pending != pending:
                    raise BenchError(f"the quiet scan was not quiet: {report}")
                if round_:
                    runs[pending].append((time.perf_counter() - started) * 1000)
    finally:
        redis_sweep.read_pages = original  # type: ignore[assignment]
    small, large = harness.median(runs[100]), harness.median(runs[big])
    print(
        f"\nquiet scan, reap_once in process: {consumers:,} live consumers, nothing stale; "
        f"median of {QUIET_ROUNDS}: {small:.0f} ms with 100 pending, {large:.0f} ms with "
        f"{big:,}; pending lists read: {reads}"
    )
    ratio = large / small
    harness.goal(f"quiet scan {big:,} / 100 pending", ratio, "<=", GOAL_QUIET, "x")


async def main(args: argparse.Namespace) -> int:
    async with harness.stores() as stores:
        print("rig-conductor reclaim as users run it: reap --once, INFO, stderr through a pipe")
        print(await stores.describe())
        for shape in args.shapes:
            await measure_shape(stores, shape)
        print(
            f"\ngoals per reap --once: >= {GOAL_RATE:,} entries/s, >= {GOAL_RATIO:g}x the loop, "
            f"peak RSS < {GOAL_RSS_MB} MB (the whole command, start-up included)"
        )
        if args.quiet_consumers:
            await quiet_scan(stores, args.quiet_consumers, args.quiet_pending)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50000/50, quiet 1,000 / 100,000")
    parser.add_argument(
        "--shapes", help="entries/dead consumers+live ones,... (200000/200+1,1000000/1000+1)"
    )
    parser.add_argument("--quiet-consumers", type=int, help="10,000 (0: skip the quiet scan)")
    parser.add_argument("--quiet-pending", type=int, help="the big quiet case (1,000,000)")
    args = parser.parse_args()
    quick = args.quick
    shapes = args.shapes or ("50000/50+1" if quick else "200000/200+1,1000000/1000+1")
    args.shapes = [Shape.parse(spec) for spec in shapes.split(",")]
    if args.quiet_consumers is None:
        args.quiet_consumers = 1_000 if quick else 10_000
    args.quiet_pending = args.quiet_pending or (100_000 if quick else 1_000_000)
    sys.exit(harness.run(main(args)))
