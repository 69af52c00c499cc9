"""Reclaim as users run it: `rig-conductor reap --once` as a subprocess at INFO, its stderr read
through a pipe, against the XAUTOCLAIM COUNT 10 loop of the source design on the same data set;
and the cost of a quiet scan with a million pending entries against a hundred.

    .venv/bin/python bench/reclaim.py            # 200,000 / 200 + 1 and 1,000,000 / 1,000 + 1
    .venv/bin/python bench/reclaim.py --quick    # 50,000 / 50 + 1, quiet scan on 1,000 consumers
    .venv/bin/python bench/reclaim.py --shapes 1000000/1000+1 --quiet-consumers 0
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import harness
from harness import GROUP, TENANT, BenchError, CliRun, Shape, Stores, redis_kit
from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.domain import ConsumerName, GroupName, StreamKey
from rig_conductor.effects import port
from rig_conductor.reaper.cycle import ScanReport, reap_once
from rig_conductor.settings import Settings

STREAM = "bench:reclaim"
RECOVERY = "recovery-worker-01"  # the loop's claiming consumer
STALE_MS, AGENT_DOWN_MS = 1_000, 600_000
GOAL_RATE, GOAL_RATIO, GOAL_RSS_MB, GOAL_QUIET = 150_000, 2.0, 250, 1.5
GOAL_BUSY = 0.85  # Redis's own busy time for the least work / the whole command's wall time
QUIET_AGENTS = (*harness.LIVE_AGENTS, "review-e-codex", "dev-e-dotnet", "dev-e-python")
QUIET_ROUNDS = 5
SHAPES = ("200000/200+1,1000000/1000+1", "50000/50+1")  # E/C+S: entries / dead + live consumers


async def reap_here(
    stores: Stores, stream: str, agent_ids: str, stale_ms: int
) -> tuple[ScanReport, float]:
    """`reap_once` called in this process: its report and seconds."""
    servers = {"redis_url": stores.servers.redis_url, "database_url": stores.servers.database_url}
    settings = Settings(
        **servers, streams=(stream,), agent_ids=tuple(agent_ids.split(",")), tenant=TENANT,
        entry_stale_ms=stale_ms, agent_down_ms=AGENT_DOWN_MS, dry_run=False,
    )  # fmt: skip
    started = time.perf_counter()
    report = await reap_once(
        redis=stores.redis,
        engine=stores.engine,
        settings=settings,
        effects=port.choose(False, engine=stores.engine, tenant=TENANT),
    )
    return report, time.perf_counter() - started


def row(label: str, rate: float, loop: float | None = None, rest: str = "") -> None:
    """One line of a shape: `label`, entries/s, the ratio to the loop and `rest`."""
    versus = f" {rate / loop:5.1f}x the loop  {rest}" if loop else ""
    print(f"  {label:<40} {rate:>9,.0f} entries/s{versus}", flush=True)


async def autoclaim_loop(stores: Stores, shape: Shape) -> float:
    """The baseline: `XAUTOCLAIM <stream> g recovery-worker-01 <min-idle> <cursor> COUNT 10`
    until the cursor is back at 0-0. It only moves entries: no event log, no log line."""
    min_idle = 1_000
    await harness.plant(stores, shape, STREAM, min_idle)
    started = time.perf_counter()
    cursor, claimed = "0-0", 0
    while True:
        reply = await stores.redis.xautoclaim(STREAM, GROUP, RECOVERY, min_idle, cursor, count=10)
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
    dead = {ConsumerName(c): 0 for _, c in shape.dead}
    ids = await redis_kit.pending_entries(
        stores.redis, stream=StreamKey(STREAM), group=GroupName(GROUP), min_idle_ms=dead
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


async def redis_busy(stores: Stores) -> float:
    """Seconds Redis spent executing commands since the last CONFIG RESETSTAT (INFO
    commandstats: the `usec` of every command, summed; the INFO call itself left out)."""
    stats = await stores.redis.info("commandstats")
    return sum(v["usec"] for k, v in stats.items() if k != "cmdstat_info") / 1e6


async def least_work(stores: Stores, shape: Shape) -> tuple[float, float]:
    """The least work a move needs, done by a plain client: XPENDING of each dead consumer, then
    `XCLAIM ... JUSTID` in batches of 1,000 ids, one command at a time. Redis's busy time for it
    (INFO commandstats, the limit of any reclaim) and the client's wall time, in seconds."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    redis, target = stores.redis, shape.live[0][1]
    await redis.config_resetstat()
    started = time.perf_counter()
    ids: list[str] = []
    for _, consumer in shape.dead:
        held = await redis.xpending_range(
            STREAM, GROUP, min="-", max="+", count=shape.per_consumer, consumername=consumer
        )
        ids.extend(row["message_id"] for row in held)
    moved = 0
    for start in range(0, len(ids), 1_000):
        reply = await redis.xclaim(
            STREAM, GROUP, target, STALE_MS, ids[start : start + 1_000], justid=True
        )
        moved += len(reply)
    wall = time.perf_counter() - started
    busy = await redis_busy(stores)
    if moved != shape.stale:
        raise BenchError(f"the least work moved {moved:,} of {shape.stale:,} entries")
    return busy, wall


def cpu_bound(cpu: dict[str, float], busy: float) -> tuple[str, float]:
    """The run's CPU, and the highest share of the least work's busy time any schedule of that
    CPU could reach here: on N cores it needs at least sum / N seconds of wall time."""
    cores = os.cpu_count() or 1
    least_wall = sum(cpu.values()) / cores
    spent = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in cpu.items())
    return f"{spent}: on {cores} cores at least {least_wall:.2f} s", busy / least_wall


def serial_bound(busy: float, nothing: float) -> float:
    """The highest share of the least work's busy time (`busy`) the command could reach on any
    number of cores: Redis runs one command at a time, and none of the moves' before the command
    is up, so its wall time is at least its run with nothing to move (`nothing`) plus `busy`."""
    return busy / (nothing + busy)


def cli_settings(shape: Shape, stream: str) -> dict[str, object]:
    """The settings of every `reap --once` run of `shape` on `stream`."""
    return {
        "entry_stale_ms": STALE_MS, "agent_down_ms": AGENT_DOWN_MS, "tenant": TENANT,
        "streams": stream, "agent_ids": shape.agent_ids,
    }  # fmt: skip


async def reap_cli(stores: Stores, shape: Shape, log_format: str) -> tuple[CliRun, Any]:
    """The headline: the whole command's run and its scan report."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    settings = cli_settings(shape, STREAM) | {"log_format": log_format}
    await stores.redis.config_resetstat()
    # The CPU of the three processes a reclaim keeps busy: the command, Redis and PostgreSQL.
    command, redis = harness.children_cpu_s(), await harness.redis_cpu_s(stores.redis)
    with harness.postgres_cpu(stores.servers.database_url) as postgres:
        run, report = await harness.run_reap(stores, shape.stale, **settings)
    report["redisBusyS"] = await redis_busy(stores)  # the command's own commands, for the text
    report["cpuS"] = {
        "command": harness.children_cpu_s() - command,
        "redis": await harness.redis_cpu_s(stores.redis) - redis,
        "postgres": postgres[0],
    }
    await harness.verify_moved(stores, shape, STREAM, to=set())
    return run, report


async def reap_nothing(stores: Stores, shape: Shape, runs: int) -> float:
    """The whole command with nothing to move (a stream that does not exist), median of `runs`:
    its start-up, discovery and exit, the part of a reclaim Redis waits through."""
    settings = cli_settings(shape, f"{STREAM}:none")
    seconds = [(await harness.run_reap(stores, 0, **settings))[0].seconds for _ in range(runs)]
    return harness.median(seconds)


async def reap_in_process(stores: Stores, shape: Shape) -> float:
    """Secondary: `reap_once` called in this process, rig_conductor logging at WARNING."""
    await harness.plant(stores, shape, STREAM, STALE_MS)
    logging.getLogger("rig_conductor").setLevel(logging.WARNING)
    report, seconds = await reap_here(stores, STREAM, shape.agent_ids, STALE_MS)
    await harness.verify_moved(stores, shape, STREAM, to=set())
    await stores.check_reclaimed(shape.stale, report.reclaimed, report.reclaimed)  # no lines
    return report.reclaimed / seconds


async def measure_shape(stores: Stores, shape: Shape, runs: int) -> dict[str, Any]:
    """The shape's lines; what they say, for `--json`."""
    print(f"\n{shape}: {shape.stale:,} stale entries", flush=True)
    loop = await autoclaim_loop(stores, shape)
    row("XAUTOCLAIM COUNT 10 loop (baseline)", loop)
    floor = await claim_floor(stores, shape)
    note = "(Redis's own cost of the moves: no discovery, no log)"
    row("XCLAIM JUSTID of known ids, pipelined", floor, loop, note)
    busy, naive = await least_work(stores, shape)
    print(
        f"  least work (XPENDING per dead consumer, XCLAIM JUSTID x 1,000): Redis busy "
        f"{busy:5.2f} s (INFO commandstats); a plain client doing it takes {naive:5.2f} s",
        flush=True,
    )
    measured: dict[str, Any] = {
        "shape": str(shape), "entries": shape.stale, "loopPerS": round(loop),
        "floorPerS": round(floor), "leastWorkRedisBusyS": round(busy, 3),
        "leastWorkPlainClientS": round(naive, 3), "reap": {},
    }  # fmt: skip
    nothing = await reap_nothing(stores, shape, max(3, runs))
    serial = serial_bound(busy, nothing)
    print(
        f"  reap --once with nothing to move (start-up, discovery, exit): {nothing:5.2f} s; with "
        f"the least work's busy time besides, no number of cores brings the share above "
        f"{serial:.2f}",
        flush=True,
    )
    measured |= {"nothingToMoveS": round(nothing, 3), "leastWorkShareSerialBound": round(serial, 3)}
    done: dict[str, list[tuple[CliRun, Any]]] = {"text": [], "json": []}
    for _ in range(runs):  # the formats alternate: a slow spell of the machine hits both
        for log_format, results in done.items():
            results.append(await reap_cli(stores, shape, log_format))
    for log_format, results in done.items():
        results.sort(key=lambda result: result[0].seconds)
        run, report = results[len(results) // 2]  # the median run (of an even count, the slower)
        rate, rss = shape.stale / run.seconds, max(r.rss_mb for r, _ in results)
        share = busy / run.seconds  # of the command's wall time, what Redis's least work needs
        checks = {
            "entries/s": rate >= GOAL_RATE,
            "ratio": rate / loop >= GOAL_RATIO,
            "busy": share >= GOAL_BUSY,
            "RSS": rss < GOAL_RSS_MB,
            "lines": all(r.lines == shape.stale for r, _ in results),
        }
        missed = [name for name, ok in checks.items() if not ok]
        goals = "MISSED: " + ", ".join(missed) if missed else "met"
        rates = [shape.stale / r.seconds for r, _ in results]
        spread = f"  median of {runs}: {rates[-1]:,.0f}-{rates[0]:,.0f}/s" if runs > 1 else ""
        rest = f"{run.seconds:5.2f} s  peak RSS {rss:4.0f} MB  {run.lines:,} lines{spread}"
        row(f"reap --once, INFO, {log_format} log", rate, loop, f"{rest}  goals {goals}")
        print(
            f"      least work's Redis busy time / this wall time: {share:.2f} (goal >= "
            f"{GOAL_BUSY}); the command's own Redis busy time {report['redisBusyS']:.2f} s",
            flush=True,
        )
        spent, best = cpu_bound(report["cpuS"], busy)
        print(f"      CPU of this run: {spent}, so the share can reach at most {best:.2f}")
        for phase, ms in (report.get("phasesMs") or {}).items():
            print(f"      {phase:<34} {ms * 1000 / shape.stale:7.2f} µs/entry")
        measured["reap"][log_format] = {
            "seconds": [round(r.seconds, 3) for r, _ in results],
            "medianSeconds": round(run.seconds, 3), "perS": round(rate),
            "leastWorkShare": round(share, 3), "redisBusyS": round(report["redisBusyS"], 3),
            "cpuS": {name: round(seconds, 3) for name, seconds in report["cpuS"].items()},
            "leastWorkShareBound": round(best, 3),
            "peakRssMb": round(rss), "lines": [r.lines for r, _ in results], "goals": goals,
        }  # fmt: skip
    in_process = await reap_in_process(stores, shape)
    row("reap_once in process, WARNING", in_process, loop, "(secondary)")
    measured["inProcessPerS"] = round(in_process)
    return measured


async def quiet_scan(stores: Stores, consumers: int, big: int) -> None:
    """Nothing stale: `consumers` consumers of live, heartbeating agents, in streams holding 100,
    one per consumer, and `big` pending entries. The cases' scans alternate (a warm-up round,
    then QUIET_ROUNDS), so load from elsewhere on the machine hits them alike.

    With 100 entries only 100 consumers hold any; with one per consumer, as with `big`, all
    of them do, and a scan looks up the heartbeats of every consumer holding entries. So the
    second ratio, `big` against one per consumer, is the cost of the entries themselves."""
    await stores.reset()
    pairs = harness.consumers(QUIET_AGENTS, consumers)
    cases = {n: f"bench:quiet:{n}" for n in (100, consumers, big)}
    for pending, stream in cases.items():
        await harness.add_entries(stores.redis, stream, pending)
        await stores.redis.xgroup_create(stream, GROUP, id="0")
        await harness.add_consumers(stores.redis, stream, pairs)
        share = [pending * i // consumers for i in range(consumers + 1)]  # even, sums up
        held = [(c, share[i + 1] - share[i]) for i, (_, c) in enumerate(pairs)]
        await harness.deliver(stores.redis, stream, held)
    await harness.heartbeat(stores.engine, pairs)
    agents = ",".join(QUIET_AGENTS)
    runs: dict[int, list[float]] = {pending: [] for pending in cases}
    pages = mock.patch.object(redis_sweep, "read_pages", wraps=redis_sweep.read_pages)
    with pages as reads:  # counts the pending lists read
        for round_ in range(QUIET_ROUNDS + 1):
            for pending, stream in cases.items():
                gc.collect()  # no collection owed by the planting lands in one case's time
                report, seconds = await reap_here(stores, stream, agents, 300_000)
                if report.reclaimed or report.consumers_down or report.pending != pending:
                    raise BenchError(f"the quiet scan was not quiet: {report}")
                if round_:
                    runs[pending].append(seconds * 1000)
    small, each, large = (harness.median(runs[n]) for n in cases)
    print(
        f"\nquiet scan, reap_once in process: {consumers:,} live consumers, nothing stale; "
        f"median of {QUIET_ROUNDS}: {small:.0f} ms with 100 pending, {each:.0f} ms with "
        f"{consumers:,} (one per consumer), {large:.0f} ms with {big:,}; pending lists read: "
        f"{reads.call_count}"
    )
    harness.goal(f"quiet scan {big:,} / 100 pending", large / small, "<=", GOAL_QUIET, "x")
    harness.goal(
        f"quiet scan {big:,} / {consumers:,} pending (every consumer holding some in both)",
        large / each,
        "<=",
        GOAL_QUIET,
        "x",
    )


async def main(args: argparse.Namespace) -> int:
    title = "rig-conductor reclaim as users run it: reap --once, INFO, stderr through a pipe"
    async with harness.stores(title) as stores:
        shapes = [await measure_shape(stores, shape, args.runs) for shape in args.shapes]
        print(
            f"\ngoals per reap --once: >= {GOAL_RATE:,} entries/s, >= {GOAL_RATIO:g}x the loop, "
            f">= {GOAL_BUSY} of Redis's busy time for the least work, peak RSS < {GOAL_RSS_MB} MB "
            "(the whole command, start-up included), every line present"
        )
        if args.quiet_consumers:
            await quiet_scan(stores, args.quiet_consumers, args.quiet_pending)
        if args.json:
            figures = json.dumps({"shapes": shapes}, indent=2) + "\n"
            await asyncio.to_thread(Path(args.json).write_text, figures)
            print(f"results as JSON: {args.json}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50000/50, quiet 1,000 / 100,000")
    parser.add_argument("--runs", type=int, help="reap --once runs per format: 3 (the median)")
    parser.add_argument("--shapes", help="E/C+S,... (200000/200+1,1000000/1000+1)")
    parser.add_argument("--quiet-consumers", type=int, help="10,000 (0: skip the quiet scan)")
    parser.add_argument("--quiet-pending", type=int, help="the big quiet case (1,000,000)")
    parser.add_argument("--json", metavar="FILE", help="also write the reclaim figures as JSON")
    args = harness.options(
        parser,
        shapes=SHAPES,
        runs=(3, 1),
        quiet_consumers=(10_000, 1_000),
        quiet_pending=(1_000_000, 100_000),
    )
    args.shapes = [Shape.parse(spec) for spec in args.shapes.split(",")]
    sys.exit(harness.run(main(args)))
