"""Heartbeat ingest: `rig-conductor serve` against a no-op FastAPI endpoint (bench/noop_app.py),
the same wrk load on each in alternating rounds; every 202 of the conductor checked as durable.
Each heartbeat carries its agent's own bound token (RIG_AGENT_TOKENS), as a fleet that fails
closed sends them: the conductor looks up every token and checks what it may speak for.

    .venv/bin/python bench/ingest.py [--quick] [--rounds 10] [--duration 3] [--connections 32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psycopg

import harness
from harness import BenchError
from noop_app import SERVE_STACK, STACKS

# The conductor against the raw ASGI floor on serve's stack: what no Python app can beat there.
GOAL_RATIO, GOAL_P99_MS = 0.8, 25.0
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
    wrk_cpu_s: float  # the load generator's own CPU: it shares the machine's cores
    server_cpu_s: float = 0.0  # the server process's CPU during the run

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def wrk(url: str, script: Path, connections: int, seconds: float) -> Load:
    command = ["wrk", "-t2", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", str(script)]
    before = harness.children_cpu_s()
    done = subprocess.run([*command, url], capture_output=True, text=True, check=False)
    wrk_cpu = harness.children_cpu_s() - before
    found = re.search(r"^RESULT (\{.*\})$", done.stdout, re.MULTILINE)
    if done.returncode != 0 or found is None:
        raise BenchError(f"wrk exited {done.returncode}: {done.stdout[-300:]}{done.stderr[-300:]}")
    r = json.loads(found.group(1))
    return Load(r["requests"], r["us"] / 1e6, r["non2xx"], r["errors"], r["p99"] / 1e3, wrk_cpu)


def load(target: Target, script: Path, connections: int, seconds: float) -> Load:
    """One wrk run against `target`, with the CPU its server process spent meanwhile."""
    before = harness.cpu_s(target.pid)
    measured = wrk(target.url, script, connections, seconds)
    measured.server_cpu_s = harness.cpu_s(target.pid) - before
    return measured


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


@dataclass(frozen=True)
class Target:
    """One server under load: what answers (`app`) on which server stack."""

    app: str  # "floor", "no-op" or "conductor"
    stack: str  # a key of noop_app.STACKS
    url: str
    pid: int  # the server process: its CPU is read from /proc

    def __str__(self) -> str:
        return f"{self.app} on {self.stack}"


APPS = {  # what each line serves
    "floor": "raw ASGI: the body read, json.loads, 202",
    "no-op": "FastAPI, the Event union parsed, 202, nothing stored",
    "conductor": "rig-conductor serve, every 202 durable",
}


def start(
    stack: str, env: dict[str, str], log: IO[bytes], servers: contextlib.ExitStack
) -> list[Target]:
    """The floor, the no-op and the conductor on `stack`, each a process of its own. The
    conductor on serve's own stack is the command itself; on another, bench/serve_on.py."""
    bench = Path(__file__).parent
    targets = []
    for app in ("floor", "noop"):
        port = harness.free_port()
        command = [sys.executable, str(bench / "noop_app.py"), "--port", str(port)]
        command += ["--app", app, "--stack", stack]
        url = f"http://127.0.0.1:{port}"
        pid = servers.enter_context(harness.process(command, env, f"{url}/healthz", log))
        targets.append(Target("no-op" if app == "noop" else app, stack, f"{url}/api/events", pid))
    if stack == SERVE_STACK:
        command = [*harness.COMMAND, "serve"]
    else:
        command = [sys.executable, str(bench / "serve_on.py"), stack]
    url, pid = servers.enter_context(harness.serving(env, log, command))
    return [*targets, Target("conductor", stack, f"{url}/api/events", pid)]


def measure(args: argparse.Namespace, found: harness.Servers, tmp: Path) -> int:
    script = tmp / "heartbeat.lua"
    script.write_text(  # JSON strings are Lua strings
        WRK_LUA % (",\n".join(map(json.dumps, BODIES)), ",\n".join(map(json.dumps, AUTHORIZATIONS)))
    )
    log = EventLog(found.database_url)
    log.truncate()
    env = harness.conductor_env(found)  # the same for every server (the baselines read none)
    if not args.open:
        env["RIG_AGENT_TOKENS"] = ",".join(f"{agent}:{token}" for agent, token in TOKENS.items())
    with (tmp / "servers.log").open("wb") as servers_log, contextlib.ExitStack() as servers:
        targets = [t for stack in args.stacks for t in start(stack, env, servers_log, servers)]
        for target in targets:
            wrk(target.url, script, args.connections, args.warmup)
        loads, problems = rounds(args, targets, script, log)
        # Durable storage per heartbeat: one more run of serve, between two settled readings of
        # the row versions written.
        log.truncate()
        before = log.written()
        with harness.postgres_cpu(found.database_url) as database_cpu:
            wrk(targets[2].url, script, args.connections, args.duration)  # the conductor
        stored = max(log.settled(), 1)
        per_beat = (log.written() - before) / stored
    report(targets, loads)
    floor, noop, conductor = targets[:3]  # serve's stack
    ratio = ratio_median(loads, conductor, floor)
    harness.goal("conductor / raw ASGI floor, median of the rounds", ratio, ">=", GOAL_RATIO)
    versus_noop = ratio_median(loads, conductor, noop)
    print(f"  conductor / FastAPI no-op, median of the rounds: {versus_noop:.2f}")
    worst = max(load.p99_ms for load in loads[conductor])
    harness.goal("conductor p99, worst round", worst, "<=", GOAL_P99_MS, " ms")
    harness.goal("rows written per heartbeat", per_beat, "<=", GOAL_ROWS_PER_BEAT)
    database_us = database_cpu[0] * 1e6 / stored
    if database_cpu[0]:  # PostgreSQL on this machine: its CPU is a replica's other cost
        print(f"  PostgreSQL CPU per heartbeat stored: {database_us:.0f} us")
    cpu_budget(loads, floor, conductor, database_us)
    for problem in problems:
        print(f"  not durable: {problem}")
    if problems:
        raise BenchError("a heartbeat answered 202 was not in the event log (see above)")
    print("  every 202 durable: met")
    return 0


def rounds(
    args: argparse.Namespace, targets: list[Target], script: Path, log: EventLog
) -> tuple[dict[Target, list[Load]], list[str]]:
    """Every target loaded once per round, one after the other, the order turning each round
    (the machine's speed drifts over seconds); the round's requests/s printed as it ends."""
    print(f"{'round':<7}" + "".join(f"{t.app:>12}" for t in targets))
    print(f"{'':<7}" + "".join(f"{t.stack.split('+')[0]:>12}" for t in targets))
    loads: dict[Target, list[Load]] = {target: [] for target in targets}
    problems: list[str] = []
    for n in range(args.rounds):
        turn = n % len(targets)
        for target in targets[turn:] + targets[:turn]:
            if target.app == "conductor":
                log.truncate()
            measured = load(target, script, args.connections, args.duration)
            loads[target].append(measured)
            if target.app == "conductor":
                lost = log.durability(measured, args.connections)
                problems += [f"round {n + 1}, {target}: {problem}" for problem in lost]
        print(f"{n + 1:<7}" + "".join(f"{loads[t][-1].rps:>12,.0f}" for t in targets))
    return loads, problems


def ratio_median(loads: dict[Target, list[Load]], target: Target, baseline: Target) -> float:
    """The median over the rounds of `target`'s requests/s over `baseline`'s in the same round."""
    pairs = zip(loads[target], loads[baseline], strict=True)
    return harness.median([mine.rps / theirs.rps for mine, theirs in pairs])


def report(targets: list[Target], loads: dict[Target, list[Load]]) -> None:
    """Per target: its app and stack, median requests/s, worst p99, and its ratio to the floor
    on the same stack; then each app on serve's stack against the same app on the others."""
    print(f"\n{'app':<10}{'server stack':<26}{'req/s':>9}{'p99 ms':>8}{'/ floor':>9}  serves")
    for target in targets:
        floor = next(t for t in targets if t.stack == target.stack and t.app == "floor")
        rps = harness.median([load.rps for load in loads[target]])
        p99 = max(load.p99_ms for load in loads[target])
        ratio = ratio_median(loads, target, floor)
        print(
            f"{target.app:<10}{'uvicorn ' + target.stack:<26}{rps:>9,.0f}{p99:>8.1f}"
            f"{ratio:>9.2f}  {APPS[target.app]}"
        )
    for stack in sorted({t.stack for t in targets} - {SERVE_STACK}):
        ours = {t.app: t for t in targets if t.stack == SERVE_STACK}
        gains = [
            f"{t.app} {ratio_median(loads, ours[t.app], t):.2f}x"
            for t in targets
            if t.stack == stack
        ]
        print(f"  uvicorn {SERVE_STACK} over {stack}, median of the rounds: {', '.join(gains)}")
    print()


def cpu_per_request_us(loads: list[Load]) -> tuple[float, float]:
    """The server's and wrk's CPU per answered request over the rounds, in microseconds."""
    requests = sum(measured.requests for measured in loads)
    server = sum(measured.server_cpu_s for measured in loads)
    return server * 1e6 / requests, sum(measured.wrk_cpu_s for measured in loads) * 1e6 / requests


def cpu_budget(
    loads: dict[Target, list[Load]], floor: Target, conductor: Target, database_us: float
) -> None:
    """Where the conductor's CPU per heartbeat stands against the floor's, and the cores the
    goal's rate would take here: one uvicorn worker runs on one core, and PostgreSQL and wrk
    share the machine's others."""
    floor_us, floor_wrk_us = cpu_per_request_us(loads[floor])
    conductor_us, wrk_us = cpu_per_request_us(loads[conductor])
    print(
        f"  CPU per request, all rounds: floor {floor_us:.0f} us; conductor {conductor_us:.0f} "
        f"us, and PostgreSQL {database_us:.0f} us per heartbeat; wrk {wrk_us:.0f} us"
    )
    goal_rps = GOAL_RATIO * harness.median([measured.rps for measured in loads[floor]])
    budget_us = 1e6 / goal_rps
    cores = goal_rps * (conductor_us + database_us + (wrk_us + floor_wrk_us) / 2) / 1e6
    print(
        f"  at the goal's {goal_rps:,.0f} heartbeats/s: the conductor's process may spend "
        f"{budget_us:.0f} us a heartbeat on its one core (it spends {conductor_us:.0f}); with "
        f"PostgreSQL and wrk at this run's costs that rate takes {cores:.1f} cores, this "
        f"machine has {os.cpu_count()}"
    )


def main(args: argparse.Namespace) -> int:
    harness.ensure_installed("wrk", lambda: shutil.which("wrk") is not None)
    with harness.servers() as found, tempfile.TemporaryDirectory(prefix="rig-ingest-") as tmp:
        print(
            f"rig-conductor heartbeat ingest: serve vs a no-op endpoint and a raw ASGI floor, wrk, "
            f"{args.connections} connections, {args.rounds} rounds of {args.duration:g} s each, "
            f"one uvicorn worker each, server stacks {', '.join(args.stacks)}, "
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
    parser.add_argument(
        "--stacks",
        type=lambda value: value.split(","),
        default=list(STACKS),
        help=f"server stacks, serve's own first ({','.join(STACKS)})",
    )
    args = harness.options(parser, rounds=(10, 2))
    if args.stacks[0] != SERVE_STACK or not set(args.stacks) <= set(STACKS):
        parser.error(f"--stacks: {SERVE_STACK} first, then any of {', '.join(STACKS)}")
    args.warmup = 1.0 if args.quick else 2.0
    sys.exit(harness.run(lambda: main(args)))
