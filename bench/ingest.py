"""Heartbeat ingest: `rig-conductor serve` against a no-op FastAPI endpoint (bench/noop_app.py),
the same wrk load on each in alternating rounds; every 202 of the conductor checked as durable.
Each heartbeat carries its agent's own bound token (RIG_AGENT_TOKENS), as a fleet that fails
closed sends them: the conductor looks up every token and checks what it may speak for.

    .venv/bin/python bench/ingest.py [--quick] [--rounds 10] [--duration 3] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

import harness
from harness import BenchError

GOAL_RATIO, GOAL_P99_MS = 0.95, 25.0
ROLES = ("review-e", "dev-e", "test-e", "docs-e", "ops-e", "qa-e", "sec-e", "perf-e", "arch-e")
AGENTS = [f"{role}{v}" for v in ("", "-codex", "-py", "-dotnet", "-eu", "-us") for role in ROLES]
BODY = '{"type":"HEARTBEAT","agentId":"%s","consumer":"%s-rig-agent-runtime-%d",'
BODY += '"degraded":false,"degradedReasons":[]}'
BODIES = [BODY % (agent, agent, n) for n in range(10) for agent in AGENTS[:50]]
# One bound token per agent; every body goes with its agent's.
TOKENS = {agent: f"bench-token-{agent}-0123456789" for agent in AGENTS[:50]}
AUTHORIZATIONS = [f"Bearer {TOKENS[agent]}" for n in range(10) for agent in AGENTS[:50]]
WRK_LUA = """
local bodies = {%s}
local authorizations = {%s}
local requests, i = {}, 0
function init(args)
  for k, body in ipairs(bodies) do
    local headers = {["Content-Type"] = "application/json", ["Authorization"] = authorizations[k]}
    requests[k] = wrk.format("POST", "/api/events", headers, body)
  end
  i = math.random(#requests)
end
function request() i = i %% #requests + 1; return requests[i] end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('RESULT {"requests":%%d,"us":%%d,"non2xx":%%d,"errors":%%d,"p99":%%d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(99)))
end
"""


@dataclass
class Load:
    requests: int  # completed responses
    seconds: float
    non_2xx: int
    errors: int  # socket errors
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def wrk(url: str, script: Path, connections: int, seconds: float) -> Load:
    command = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script)]
    done = subprocess.run([*command, url], capture_output=True, text=True, check=False)
    found = re.search(r"^RESULT (\{.*\})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise BenchError(f"wrk exited {done.returncode}: {done.stdout[-300:]}{done.stderr[-300:]}")
    r = json.loads(found.group(1))
    return Load(r["requests"], r["us"] / 1e6, r["non2xx"], r["errors"], r["p99"] / 1e3)


# Every table a heartbeat may write to, and the goal for row versions written per heartbeat.
HEARTBEAT_TABLES = ("events", "agent_heartbeats", "consumer_heartbeats", "liveness")
GOAL_ROWS_PER_BEAT = 2.0


class EventLog:
    """The heartbeats the database accounts for, on one autocommit connection: the beats of the
    agents' liveness intervals, open and ended (each heartbeat counts for its agent)."""

    def __init__(self, database_url: str) -> None:
        self.conn = psycopg.connect(harness.conninfo(database_url), autocommit=True)

    def rows(self) -> int:
        row = self.conn.execute(
            "SELECT (SELECT COALESCE(sum(beats), 0) FROM agent_heartbeats)"
            " + (SELECT COALESCE(sum(beats), 0) FROM liveness WHERE consumer IS NULL)"
        ).fetchone()
        return int(row[0]) if row else 0

    def written(self) -> int:
        """Row versions inserted or updated in the heartbeat tables so far (statistics), once
        they have stopped changing: a backend flushes its counts within about 10 s."""
        query = (
            "SELECT COALESCE(sum(n_tup_ins + n_tup_upd), 0) FROM pg_stat_user_tables "
            "WHERE relname = ANY(%s)"
        )

        def read() -> int:
            row = self.conn.execute(query, (list(HEARTBEAT_TABLES),)).fetchone()
            return int(row[0]) if row else 0

        last, since, deadline = read(), time.monotonic(), time.monotonic() + 30
        while time.monotonic() < deadline and time.monotonic() - since < 12:
            time.sleep(0.5)
            if (now := read()) != last:
                last, since = now, time.monotonic()
        return last

    def settled(self) -> int:
        """The row count once it has not grown for 0.5 s (requests in flight get committed)."""
        last, since, deadline = self.rows(), time.monotonic(), time.monotonic() + 15
        while time.monotonic() < deadline and time.monotonic() - since < 0.5:
            time.sleep(0.1)
            if (now := self.rows()) != last:
                last, since = now, time.monotonic()
        return last

    def truncate(self) -> None:
        self.settled()  # the previous run's last heartbeats land before the TRUNCATE
        self.conn.execute("TRUNCATE events, agent_heartbeats, consumer_heartbeats, liveness")

    def durability(self, load: Load, connections: int) -> list[str]:
        """Each 202 committed before it was sent: rows when wrk exits >= completed responses;
        once settled, at most `connections` more (in flight when wrk stopped, not counted)."""
        at_exit, final = self.rows(), self.settled()
        problems = [f"{load.non_2xx} non-2xx answers"] if load.non_2xx else []
        problems += [f"{load.errors} socket errors"] if load.errors else []
        if at_exit < load.requests or not 0 <= final - load.requests <= connections:
            problems.append(f"{load.requests:,} answers, {at_exit:,} rows at exit, {final:,} later")
        return problems


def measure(args: argparse.Namespace, found: harness.Servers, tmp: Path) -> int:
    script = tmp / "heartbeat.lua"
    script.write_text(  # JSON strings are Lua strings
        WRK_LUA % (",\n".join(map(json.dumps, BODIES)), ",\n".join(map(json.dumps, AUTHORIZATIONS)))
    )
    log = EventLog(found.database_url)
    log.truncate()
    port = harness.free_port()
    noop_url = f"http://127.0.0.1:{port}"
    noop_app = [sys.executable, str(Path(__file__).with_name("noop_app.py")), "--port", str(port)]
    env = harness.conductor_env(found)  # the same for both servers (the no-op reads none of it)
    if not args.open:
        env["RIG_AGENT_TOKENS"] = ",".join(f"{agent}:{token}" for agent, token in TOKENS.items())
    with (
        (tmp / "serve.log").open("wb") as serve_log,
        harness.serve(env, log=serve_log) as conductor_url,
        harness.process(noop_app, env, f"{noop_url}/healthz", serve_log),
    ):
        urls = {"no-op": f"{noop_url}/api/events", "conductor": f"{conductor_url}/api/events"}
        for url in urls.values():
            wrk(url, script, args.connections, args.warmup)
        print(f"{'round':<7}{'no-op req/s':>13}{'conductor req/s':>17}{'ratio':>7}{'p99 ms':>15}")
        ratios, p99s, problems = [], [], []
        for n in range(args.rounds):
            loads = {}
            for name in sorted(urls, reverse=n % 2 == 1):  # alternate who goes first
                if name == "conductor":
                    log.truncate()
                loads[name] = load = wrk(urls[name], script, args.connections, args.duration)
                if name == "conductor":
                    lost = log.durability(load, args.connections)
                    problems += [f"round {n + 1}: {problem}" for problem in lost]
            noop, conductor = loads["no-op"], loads["conductor"]
            ratios.append(conductor.rps / noop.rps)
            p99s.append(conductor.p99_ms)
            p99 = f"{noop.p99_ms:.1f} / {conductor.p99_ms:.1f}"
            print(f"{n + 1:<7}{noop.rps:>13,.0f}{conductor.rps:>17,.0f}{ratios[-1]:>7.2f}{p99:>15}")
        # Durable storage per heartbeat: one more conductor run, between two settled readings of
        # the row versions written.
        log.truncate()
        before = log.written()
        wrk(urls["conductor"], script, args.connections, args.duration)
        per_beat = (log.written() - before) / max(log.settled(), 1)
    ratio, worst = harness.median(ratios), max(p99s)
    harness.goal("conductor / no-op, median of the rounds", ratio, ">=", GOAL_RATIO)
    harness.goal("conductor p99, worst round", worst, "<=", GOAL_P99_MS, " ms")
    harness.goal("rows written per heartbeat", per_beat, "<=", GOAL_ROWS_PER_BEAT)
    for problem in problems:
        print(f"  not durable: {problem}")
    if problems:
        raise BenchError("a heartbeat answered 202 was not in the event log (see above)")
    print("  every 202 durable: met")
    return 0


def main(args: argparse.Namespace) -> int:
    harness.ensure_installed("wrk", lambda: shutil.which("wrk") is not None)
    with harness.servers() as found, tempfile.TemporaryDirectory(prefix="rig-ingest-") as tmp:
        print(
            f"rig-conductor heartbeat ingest: serve vs a no-op endpoint, wrk, {args.connections} "
            f"connections, {args.rounds} rounds of {args.duration:g} s each, one uvicorn worker, "
            + ("an open API" if args.open else f"{len(TOKENS)} agents' bound tokens")
        )
        return measure(args, found, Path(tmp))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 s warm-up")
    parser.add_argument("--rounds", type=int, help="no-op / conductor pairs (10)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per run (3)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--open", action="store_true", help="an open API (RIG_ALLOW_ANONYMOUS), no tokens checked"
    )
    args = harness.options(parser, rounds=(10, 2))
    args.warmup = 1.0 if args.quick else 2.0
    sys.exit(harness.run(lambda: main(args)))
