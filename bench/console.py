"""The operator console at scale, as operators reach it: `rig-conductor serve` as a subprocess at
INFO, pages fetched over HTTP with a signed-in session.

    .venv/bin/python bench/console.py [--entries 1000000 --consumers 1000 --dead-letters 10000]

Data set: bench/reclaim.py's (half the consumers dead, holding half the entries), plus dead
letters. Each page is fetched 20 times; the figure is the server's own time (its
`Server-Timing` header), the client's wall time beside it. Goals: overview and group pages
under 300 ms at the median and p95, a page of a consumer's pending entries under 100 ms,
at the start of the list and deep inside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import httpx

from common import BenchError
from reclaim import (
    AGENT_DOWN_MS,
    GROUP,
    RECLAIM_STREAM,
    STALE_MS,
    TENANT,
    Bench,
    ReclaimShape,
    build_reclaim_set,
    servers,
)
from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import engine as pg_engine

TOKEN = "bench-operator-token"
ROUNDS = 20
GOALS_MS = {"overview": 300, "group": 300, "pending": 100, "pending-deep": 100}
DLQ_CHUNK = 2_000


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def plant_dead_letters(bench: Bench, count: int) -> None:
    for start in range(0, count, DLQ_CHUNK):
        async with bench.redis.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + DLQ_CHUNK)):
                pipe.xadd(
                    f"{RECLAIM_STREAM}:dlq",
                    {
                        "originalId": f"1-{n}",
                        "stream": RECLAIM_STREAM,
                        "group": GROUP,
                        "consumer": "dead-e-rig-agent-runtime-0",
                        "deliveries": "5",
                        "reason": "max-deliveries",
                        "type": "ISSUE_ASSIGNED",
                        "issueId": f"rc-dlq-{n}",
                        "payload": '{"repo":"rig/conductor"}',
                    },
                )
            await pipe.execute()


def start_serve(bench: Bench, shape: ReclaimShape) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
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
        RIG_HTTP_HOST="127.0.0.1",
        RIG_HTTP_PORT=str(port),
        RIG_OPERATOR_TOKENS=TOKEN,
        RIG_SCAN_INTERVAL_S="3600",
        RIG_STARTUP_DELAY_S="3600",
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "rig_conductor", "serve"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return process, f"http://127.0.0.1:{port}"


async def wait_ready(client: httpx.AsyncClient, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise BenchError(f"serve exited with {process.returncode}")
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise BenchError("serve did not become ready in 60 s")


async def measure(
    client: httpx.AsyncClient, path: str, check: Callable[[str], bool]
) -> tuple[list[float], list[float]]:
    """(server ms, client ms) of ROUNDS fetches of `path`, after one warm-up."""
    server, wall = [], []
    for round_ in range(ROUNDS + 1):
        started = time.perf_counter()
        answer = await client.get(path)
        took = (time.perf_counter() - started) * 1000
        if answer.status_code != 200 or not check(answer.text):
            raise BenchError(f"GET {path} answered {answer.status_code}: {answer.text[:300]}")
        found = re.search(r"dur=([\d.]+)", answer.headers.get("server-timing", ""))
        if found is None:
            raise BenchError(f"GET {path} has no Server-Timing header")
        if round_:
            server.append(float(found.group(1)))
            wall.append(took)
    return server, wall


async def naive_pending_page_ms(bench: Bench, shape: ReclaimShape) -> float:
    """The median of 3: XPENDING of the whole group, then one consumer's first 100 entries."""
    times = []
    consumer = shape.dead[0][1]
    for _ in range(3):
        started = time.perf_counter()
        rows = await bench.redis.xpending_range(
            RECLAIM_STREAM, GROUP, min="-", max="+", count=shape.entries
        )
        _ = [row for row in rows if row["consumer"] == consumer][:100]
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.95) - 1)]


async def run(shape: ReclaimShape, dead_letters: int) -> int:
    with servers() as found:
        redis = redis_streams.connect(found.redis_url)
        engine = pg_engine.create_engine(found.database_url)
        bench = Bench(redis, engine, found)
        try:
            built = time.perf_counter()
            await build_reclaim_set(bench, shape, STALE_MS, "console")
            await plant_dead_letters(bench, dead_letters)
            print(
                f"rig-conductor console at scale: {shape.describe()}, {dead_letters:,} dead "
                f"letters (built in {time.perf_counter() - built:.0f} s); serve as a subprocess"
            )
            dead_consumer = shape.dead[0][1]
            ids = [
                row["message_id"]
                for row in await redis.xpending_range(
                    RECLAIM_STREAM,
                    GROUP,
                    min="-",
                    max="+",
                    count=shape.per_consumer // 2,
                    consumername=dead_consumer,
                )
            ]
            middle = ids[-1]
            naive = await naive_pending_page_ms(bench, shape)
            process, url = start_serve(bench, shape)
            try:
                async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                    await wait_ready(client, process)
                    form = await client.get("/ui/login")
                    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
                    login = await client.post(
                        "/ui/login",
                        data={"token": TOKEN, "csrf": csrf.group(1) if csrf else ""},
                    )
                    if login.status_code != 303:
                        raise BenchError(f"sign-in answered {login.status_code}")
                    pending_q = f"stream={RECLAIM_STREAM}&group={GROUP}&consumer={dead_consumer}"
                    pages = {
                        "overview": ("/ui", lambda t: f"{shape.entries}" in t),
                        "group": (
                            f"/ui/group?stream={RECLAIM_STREAM}&name={GROUP}",
                            lambda t: t.count("data-consumer=") == shape.consumers,
                        ),
                        "pending": (f"/ui/pending?{pending_q}", lambda t: "Next page" in t),
                        "pending-deep": (
                            f"/ui/pending?{pending_q}&after={middle}",
                            lambda t: "Next page" in t or shape.per_consumer <= 200,
                        ),
                        "dead letters": (
                            f"/ui/deadletters?stream={RECLAIM_STREAM}",
                            lambda t: "rc-dlq-" in t,
                        ),
                        "agents": ("/ui/agents", lambda t: "Agents" in t),
                    }
                    failed = False
                    print(
                        f"  baseline: one page cut from a whole-list XPENDING of the group "
                        f"(what the PEL page avoids): {naive:7.1f} ms in process"
                    )
                    for name, (path, check) in pages.items():
                        server, wall = await measure(client, path, check)
                        goal = GOALS_MS.get(name)
                        ok = goal is None or (
                            statistics.median(server) < goal and p95(server) < goal
                        )
                        failed |= not ok
                        verdict = (
                            ""
                            if goal is None
                            else (f"goal < {goal} ms: " + ("met" if ok else "MISSED"))
                        )
                        if name.startswith("pending"):
                            verdict += f"  {naive / statistics.median(server):.0f}x the baseline"
                        print(
                            f"  {name:<13} server median {statistics.median(server):7.1f} ms  "
                            f"p95 {p95(server):7.1f} ms   client median "
                            f"{statistics.median(wall):7.1f} ms   {verdict}"
                        )
            finally:
                process.terminate()
                process.wait(timeout=30)
        finally:
            await bench.reset()
            await redis.aclose()
            await engine.dispose()
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--consumers", type=int, default=1_000)
    parser.add_argument("--dead-letters", type=int, default=10_000)
    args = parser.parse_args()
    try:
        return asyncio.run(run(ReclaimShape(args.entries, args.consumers), args.dead_letters))
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
