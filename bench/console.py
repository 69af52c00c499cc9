"""The operator console at scale, as operators reach it: `rig-conductor serve` as a subprocess at
INFO, its pages timed by the server (`Server-Timing`) against a pending page cut from XPENDING.

    .venv/bin/python bench/console.py            # 1,000,000 entries / 1,000 consumers
    .venv/bin/python bench/console.py --quick    # 100,000 / 100, 1,000 dead letters
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable

import httpx

import harness
from harness import GROUP, TENANT, BenchError, Shape, Stores

STREAM = "bench:reclaim"
TOKEN = "bench-operator-token"
ROUNDS = 20
GOALS_MS = {"overview": 300, "group": 300, "pending": 100, "pending deep": 100}


async def plant_dead_letters(stores: Stores, count: int) -> None:
    async with stores.redis.pipeline(transaction=False) as pipe:
        for n in range(count):
            fields = {"originalId": f"1-{n}", "stream": STREAM, "group": GROUP}
            fields |= {"consumer": "dead-e-rig-agent-runtime-0", "deliveries": "5"}
            fields |= {"reason": "max-deliveries", "type": "ISSUE_ASSIGNED"}
            fields |= {"issueId": f"rc-dlq-{n}", "payload": '{"repo":"rig/conductor"}'}
            pipe.xadd(f"{STREAM}:dlq", fields)  # type: ignore[arg-type]
        await pipe.execute()


async def naive_page_ms(stores: Stores, shape: Shape) -> float:
    """The baseline, median of 3: XPENDING of the whole group, then one consumer's first 100."""
    times, owner = [], shape.dead[0][1]
    for _ in range(3):
        started = time.perf_counter()
        rows = await stores.redis.xpending_range(STREAM, GROUP, "-", "+", shape.entries)
        _ = [row for row in rows if row["consumer"] == owner][:100]
        times.append((time.perf_counter() - started) * 1000)
    return harness.median(times)


async def fetch(client: httpx.AsyncClient, path: str, check: Callable[[str], bool]) -> list[float]:
    """The server's ms for ROUNDS fetches of `path` after a warm-up; every answer checked."""
    server = []
    for round_ in range(ROUNDS + 1):
        answer = await client.get(path)
        if answer.status_code != 200 or not check(answer.text):
            raise BenchError(f"GET {path} answered {answer.status_code}: {answer.text[:300]}")
        timing = re.search(r"dur=([\d.]+)", answer.headers.get("server-timing", ""))
        if timing is None:
            raise BenchError(f"GET {path} has no Server-Timing header")
        if round_:
            server.append(float(timing.group(1)))
    return server


async def main(shape: Shape, dead_letters: int) -> int:
    title = f"rig-conductor console at scale: {shape}, {dead_letters:,} dead letters"
    async with harness.stores(title) as stores:
        await harness.plant(stores, shape, STREAM, 1_000)
        await plant_dead_letters(stores, dead_letters)
        dead = shape.dead[0][1]
        half = await stores.redis.xpending_range(
            STREAM, GROUP, "-", "+", shape.per_consumer // 2, consumername=dead
        )
        naive = await naive_page_ms(stores, shape)
        print(f"  baseline: a pending page cut from a whole-group XPENDING: {naive:7.1f} ms")
        group = f"/ui/group?stream={STREAM}&name={GROUP}"
        pending = f"/ui/pending?stream={STREAM}&group={GROUP}&consumer={dead}"
        deep = f"{pending}&after={half[-1]['message_id']}"
        pages: dict[str, tuple[str, Callable[[str], bool]]] = {
            "overview": ("/ui", lambda t: f"{shape.entries}" in t),
            "group": (group, lambda t: t.count("data-consumer=") == shape.consumers),
            "pending": (pending, lambda t: "Next page" in t),
            "pending deep": (deep, lambda t: "Next page" in t or shape.per_consumer <= 200),
            "dead letters": (f"/ui/deadletters?stream={STREAM}", lambda t: "rc-dlq-" in t),
            "agents": ("/ui/agents", lambda t: "Agents" in t),
        }
        settings = {"streams": STREAM, "agent_ids": shape.agent_ids, "tenant": TENANT}
        env = harness.conductor_env(stores.servers, operator_tokens=TOKEN, **settings)
        with harness.serve(env) as url:
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                form = await client.get("/ui/login")
                csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
                form_data = {"token": TOKEN, "csrf": csrf.group(1) if csrf else ""}
                login = await client.post("/ui/login", data=form_data)
                if login.status_code != 303:
                    raise BenchError(f"sign-in answered {login.status_code}")
                for name, (path, check) in pages.items():
                    server = await fetch(client, path, check)
                    mid, p95 = harness.median(server), harness.percentile(server, 95)
                    versus = f"  {naive / mid:4.0f}x the baseline" if "pending" in name else ""
                    print(f"  {name:<13} median {mid:7.1f} ms  p95 {p95:7.1f} ms{versus}")
                    if name in GOALS_MS:
                        label = f"{name}, median and p95"
                        harness.goal(label, max(mid, p95), "<", GOALS_MS[name], " ms")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 / 100, 1,000 dead letters")
    parser.add_argument("--shape", help="entries/consumers (1000000/1000)")
    parser.add_argument("--dead-letters", type=int, help="10,000")
    args = harness.options(
        parser, shape=("1000000/1000", "100000/100"), dead_letters=(10_000, 1_000)
    )
    sys.exit(harness.run(main(Shape.parse(args.shape), args.dead_letters)))
