"""Reclaim as users run it: `rig-conductor reap --once` as a subprocess at INFO, its stderr read
by this process through a pipe, in text and in JSON, against the XAUTOCLAIM COUNT 10 loop of
seed 003 on the same data set in the same run.

    .venv/bin/python bench/reclaim_cli.py [--shapes 200000/200,1000000/1000]

The time is the whole command: start-up, migrations check, the scan, every [StreamReclaim]
line through the pipe, exit. The subprocess's peak RSS is printed too. Servers and data sets
are bench/reclaim.py's (RIG_BENCH_REDIS_URL / RIG_BENCH_DATABASE_URL, else embedded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from common import BenchError
from reclaim import (
    AGENT_DOWN_MS,
    RECLAIM_STREAM,
    STALE_MS,
    TENANT,
    Bench,
    ReclaimShape,
    build_reclaim_set,
    reclaimed_in_event_log,
    run_seed_003,
    seed_003_stale_ms,
    servers,
    verify_moved,
)
from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import engine as pg_engine

GOAL_RATIO, GOAL_RATE, GOAL_RSS_MB = 2.0, 150_000, 250


def reap_once(bench: Bench, shape: ReclaimShape, log_format: str) -> tuple[float, int, int, float]:
    """Run the CLI; (seconds, entries reclaimed per its report, [StreamReclaim] Reclaimed lines
    read from its stderr, its peak RSS in MB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(
        RIG_REDIS_URL=bench.servers.redis_url,
        RIG_DATABASE_URL=bench.servers.database_url,
        RIG_STREAMS=RECLAIM_STREAM,
        RIG_AGENT_IDS=",".join(shape.agent_ids),
        RIG_ENTRY_STALE_MS=str(STALE_MS),
        RIG_AGENT_DOWN_MS=str(AGENT_DOWN_MS),
        RIG_TENANT=TENANT,
        RIG_K8S_ENABLED="false",
        RIG_LOG_FORMAT=log_format,
    )
    seconds, report, lines, rss_mb = run_reap_once(env)
    return seconds, int(report["reclaimed"]), lines, rss_mb


def run_reap_once(env: dict[str, str]) -> tuple[float, dict[str, Any], int, float]:
    """`reap --once` with `env` as users run it, stderr read through a pipe: (seconds, its JSON
    report, [StreamReclaim] Reclaimed lines read, its peak RSS in MB)."""
    lines = 0

    def read(stream: object) -> None:
        nonlocal lines
        for line in stream:  # type: ignore[attr-defined]
            if "[StreamReclaim] Reclaimed" in line:
                lines += 1

    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "rig_conductor", "reap", "--once"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reader = threading.Thread(target=read, args=(process.stderr,))
    reader.start()
    assert process.stdout is not None
    report = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    seconds = time.perf_counter() - started
    if process.returncode != 0:
        raise BenchError(f"reap --once exited {process.returncode}")
    rss_mb = usage.ru_maxrss / 1024 if sys.platform != "darwin" else usage.ru_maxrss / 2**20
    return seconds, json.loads(report), lines, rss_mb


async def run(shapes: list[ReclaimShape]) -> int:
    with servers() as found:
        client = redis_streams.connect(found.redis_url)
        engine = pg_engine.create_engine(found.database_url)
        bench = Bench(client, engine, found)
        failed = False
        try:
            print("rig-conductor reclaim as users run it: reap --once, INFO, stderr through a pipe")
            for shape in shapes:
                b = await run_seed_003(bench, shape, seed_003_stale_ms(shape))
                print(f"  {shape.describe()}: {shape.stale_entries:,} stale entries")
                print(f"    (b) XAUTOCLAIM COUNT 10 loop      {b.rate:>10,.0f} entries/s")
                for log_format in ("text", "json"):
                    await build_reclaim_set(bench, shape, STALE_MS, f"cli {log_format}")
                    seconds, moved, lines, rss = await asyncio.to_thread(
                        reap_once, bench, shape, log_format
                    )
                    await verify_moved(bench, shape, owners=set(), moved=moved)
                    recorded = await reclaimed_in_event_log(engine)
                    if not moved == lines == recorded == shape.stale_entries:
                        raise BenchError(
                            f"moved {moved:,}, {lines:,} lines, {recorded:,} in the event log"
                        )
                    rate = moved / seconds
                    ok = rate >= GOAL_RATE and rate / b.rate >= GOAL_RATIO and rss < GOAL_RSS_MB
                    failed |= not ok
                    print(
                        f"    reap --once, {log_format:<4} log        {rate:>10,.0f} entries/s  "
                        f"{rate / b.rate:4.1f}x (b)  {seconds:6.2f} s  peak RSS {rss:5.0f} MB  "
                        f"{lines:,} lines  {'met' if ok else 'MISSED'}"
                    )
            print(
                f"  goals: >= {GOAL_RATE:,} entries/s, >= {GOAL_RATIO:g}x (b), "
                f"peak RSS < {GOAL_RSS_MB} MB (the whole command: start-up included)"
            )
        finally:
            await bench.reset()
            await client.aclose()
            await engine.dispose()
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="200000/200,1000000/1000", help="entries/consumers,...")
    args = parser.parse_args()
    shapes = [
        ReclaimShape(int(e), int(c)) for e, c in (s.split("/") for s in args.shapes.split(","))
    ]
    try:
        return asyncio.run(run(shapes))
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
