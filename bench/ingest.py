"""Heartbeat ingest benchmark: `rig-conductor serve` against a no-op FastAPI endpoint.

    .venv/bin/python bench/ingest.py [--duration 10] [--connections 32] [--quick] [--profile]

Both servers run side by side (one uvicorn worker each); each gets the same HTTP load in turn:
HEARTBEAT bodies over 50 agent ids and 500 consumer names. The conductor answers 202 only once
the heartbeat is committed in PostgreSQL; the no-op app (bench/noop_app.py) validates the body
with the same model and answers 202. After the conductor run the `events` table must hold a
HEARTBEAT row for every 202. See bench/README.md for what each number means.

Database: RIG_BENCH_DATABASE_URL (default
postgresql+psycopg://postgres@127.0.0.1:5432/rig_bench_ingest), created if missing, migrated
with `rig-conductor migrate`, its heartbeat tables and `events` TRUNCATEd before the run.
Redis: RIG_BENCH_REDIS_URL (default redis://127.0.0.1:6379/15); heartbeats never touch it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from common import BenchError, conninfo, ensure_database

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/rig_bench_ingest"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
GOAL_RATIO = 0.75
GOAL_P99_MS = 50.0
ENDPOINT = "/api/events"
THREADS = 2
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 40.0  # serve drains for up to 30 s (timeout_graceful_shutdown)
QUIESCE_TIMEOUT_S = 15.0
PROFILE_RATE_HZ = 100
OTHER_LOAD_WARN = 0.15  # cores used by unrelated processes during a timed run

BENCH_DIR = Path(__file__).resolve().parent
BIN_DIR = Path(sys.executable).parent

# 50 agent ids; several extend another (review-e-codex extends review-e), as in production.
ROLES = ("review-e", "dev-e", "test-e", "docs-e", "ops-e", "qa-e", "sec-e", "perf-e", "arch-e")
VARIANTS = ("", "-codex", "-py", "-dotnet", "-eu", "-us")
AGENTS = tuple(f"{role}{variant}" for variant in VARIANTS for role in ROLES)[:50]
PODS_PER_AGENT = 10  # 500 consumer names


def heartbeat_bodies() -> list[str]:
    """One HEARTBEAT body per consumer; consumer i belongs to agent i % 50."""
    bodies = []
    for n in range(PODS_PER_AGENT):
        for agent in AGENTS:
            body = {
                "type": "HEARTBEAT",
                "agentId": agent,
                "consumer": f"{agent}-rig-agent-runtime-{n}",
                "degraded": False,
                "degradedReasons": [],
            }
            bodies.append(json.dumps(body, separators=(",", ":")))
    return bodies


# --------------------------------------------------------------------------------------------
# Database


def migrate(url: str, redis_url: str, workdir: Path) -> None:
    env = server_env(url, redis_url, port=8080)  # not bound: migrate only validates it
    done = subprocess.run(
        [*conductor_command(), "migrate"],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"rig-conductor migrate exited {done.returncode}: {done.stderr.strip()}")


class Db:
    """One autocommit connection for counts, TRUNCATE and the PostgreSQL statistics."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(conninfo(url), autocommit=True)
        self.name = make_url(url).database

    def close(self) -> None:
        self.conn.close()

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        row = self.conn.execute(sql.encode(), params).fetchone()
        return None if row is None else row[0]

    def truncate(self) -> None:
        self.conn.execute(b"TRUNCATE events, agent_heartbeats, consumer_heartbeats")

    def heartbeat_rows(self) -> int:
        return int(self.scalar("SELECT count(*) FROM events WHERE kind = 'HEARTBEAT'"))

    def batch_sizes(self) -> list[int]:
        """Rows per distinct occurred_at: the writer stamps one now() per batch transaction."""
        rows = self.conn.execute(
            b"SELECT count(*) FROM events WHERE kind = 'HEARTBEAT' GROUP BY occurred_at"
        ).fetchall()
        return sorted(int(r[0]) for r in rows)

    def commits(self) -> int:
        return int(
            self.scalar(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        )

    def server_pids(self) -> list[int]:
        """Backends of this database (not this one) and the shared background processes."""
        rows = self.conn.execute(
            b"SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "
            b"(datname = current_database() OR backend_type IN "
            b"('walwriter', 'checkpointer', 'background writer', 'autovacuum launcher'))"
        ).fetchall()
        return [int(r[0]) for r in rows]

    def wait_quiet(self) -> tuple[int, float]:
        """Waits until the HEARTBEAT row count stops growing; returns it and the wait."""
        started = time.monotonic()
        last, stable_since = self.heartbeat_rows(), time.monotonic()
        while time.monotonic() - started < QUIESCE_TIMEOUT_S:
            time.sleep(0.1)
            now = self.heartbeat_rows()
            if now != last:
                last, stable_since = now, time.monotonic()
            elif time.monotonic() - stable_since >= 0.5:
                break
        return last, time.monotonic() - started

    def version(self) -> str:
        return str(self.scalar("SHOW server_version"))


# --------------------------------------------------------------------------------------------
# CPU accounting (/proc): who used the two cores during a run


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of a process, all its threads."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime


def proc_cpu_s(pid: int) -> float | None:
    times = proc_times(pid)
    return None if times is None else sum(times)


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds summed over all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    total = sum(values[:8])
    idle = values[3] + values[4]
    return (total - idle) / CLK_TCK, total / CLK_TCK


def wait_for_idle_machine(limit_s: float) -> str:
    """Up to `limit_s`, waits for a second in which other processes keep < 0.15 cores busy."""
    started = time.monotonic()
    busy = 0.0
    while True:
        b0, t0 = machine_cpu()
        time.sleep(1.0)
        b1, t1 = machine_cpu()
        busy = (b1 - b0) / (t1 - t0) * (os.cpu_count() or 1) if t1 > t0 else 0.0
        waited = time.monotonic() - started
        if busy < OTHER_LOAD_WARN:
            return f"machine idle ({busy:.2f} cores busy) after {waited:.0f}s"
        if waited >= limit_s:
            return f"machine still busy ({busy:.2f} cores) after {waited:.0f}s: measuring anyway"


@dataclass
class CpuSnapshot:
    wall: float
    server: tuple[float, float]
    postgres: dict[int, float]
    loader: float
    busy: float
    total: float


@dataclass
class CpuUse:
    """CPU seconds used during one timed run, per component."""

    wall: float
    server: float
    server_sys: float
    postgres: float | None
    loader: float
    machine: float
    cores: int

    @property
    def other(self) -> float:
        return max(0.0, self.machine - self.server - (self.postgres or 0.0) - self.loader)


def loader_cpu(in_process: bool) -> float:
    who = resource.RUSAGE_SELF if in_process else resource.RUSAGE_CHILDREN
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def snapshot(db: Db, server_pid: int, in_process_loader: bool) -> CpuSnapshot:
    pg = {pid: cpu for pid in db.server_pids() if (cpu := proc_cpu_s(pid)) is not None}
    busy, total = machine_cpu()
    return CpuSnapshot(
        wall=time.monotonic(),
        server=proc_times(server_pid) or (0.0, 0.0),
        postgres=pg,
        loader=loader_cpu(in_process_loader),
        busy=busy,
        total=total,
    )


def cpu_between(before: CpuSnapshot, after: CpuSnapshot) -> CpuUse:
    pg: float | None = None
    if after.postgres:
        pg = sum(cpu - before.postgres.get(pid, 0.0) for pid, cpu in after.postgres.items())
    return CpuUse(
        wall=after.wall - before.wall,
        server=sum(after.server) - sum(before.server),
        server_sys=after.server[1] - before.server[1],
        postgres=pg,
        loader=after.loader - before.loader,
        machine=after.busy - before.busy,
        cores=os.cpu_count() or 1,
    )


# --------------------------------------------------------------------------------------------
# Servers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def conductor_command() -> list[str]:
    script = BIN_DIR / "rig-conductor"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rig_conductor"]


def server_env(database_url: str, redis_url: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(
        RIG_DATABASE_URL=database_url,
        RIG_REDIS_URL=redis_url,
        RIG_HTTP_HOST="127.0.0.1",
        RIG_HTTP_PORT=str(port),
        RIG_STARTUP_DELAY_S="3600",  # no reaper scan during the benchmark
        RIG_K8S_ENABLED="false",
        RIG_LOG_FORMAT="text",
    )
    return env


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    cwd: Path
    cpus: frozenset[int] | None = None  # pinned to these cores when set
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{ENDPOINT}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        cpus = self.cpus

        def pin() -> None:  # in the child, before exec: every thread it starts inherits it
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C at the terminal reaches only the benchmark
                preexec_fn=pin,  # the benchmark has started no threads yet
            )

    def wait_ready(self, body: str) -> None:
        """Until one POST of a heartbeat answers 202."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        problem = "no answer"
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited during start-up:\n{self.log_tail()}")
            request = urllib.request.Request(
                self.url,
                data=body.encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as answer:
                    if answer.status == 202:
                        return
                    problem = f"status {answer.status}"
            except urllib.error.HTTPError as exc:
                problem = f"status {exc.code}: {exc.read()[:200]!r}"
            except OSError as exc:
                problem = str(exc)
            time.sleep(0.2)
        raise BenchError(f"{self.name} not ready after {READY_TIMEOUT_S:.0f}s ({problem})")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited in STOP_TIMEOUT_S."""
        if self.proc is None or self.exit_code is not None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.exit_code = self.proc.returncode

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def running(servers: Sequence[Server]) -> Iterator[None]:
    try:
        for server in servers:
            server.start()
        yield
    finally:
        for server in servers:
            server.stop()


@contextlib.contextmanager
def terminate_on_sigterm() -> Iterator[None]:
    """SIGTERM to the benchmark unwinds like Ctrl-C, so the servers are stopped."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --------------------------------------------------------------------------------------------
# Load: wrk with a Lua script, or an asyncio fallback


WRK_LUA = """
local bodies = {%(bodies)s}
local requests = {}
local i = 0
local n_threads = 0

function setup(thread)
  thread:set("offset", n_threads * 137)
  n_threads = n_threads + 1
end

function init(args)
  local headers = {["Content-Type"] = "application/json"}
  for k, body in ipairs(bodies) do
    requests[k] = wrk.format("POST", "%(path)s", headers, body)
  end
  i = offset or 0
end

function request()
  i = i %% #requests + 1
  return requests[i]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH-RESULT {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"status\\":%%d," ..
    "\\"connect\\":%%d,\\"read\\":%%d,\\"write\\":%%d,\\"timeout\\":%%d," ..
    "\\"p50_us\\":%%d,\\"p90_us\\":%%d,\\"p99_us\\":%%d,\\"max_us\\":%%d,\\"mean_us\\":%%.1f}\\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
"""


@dataclass
class Load:
    """One closed-loop load run: `requests` completed responses in `duration_s`."""

    loader: str
    connections: int
    requests: int
    duration_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    non_2xx: int
    socket_errors: dict[str, int]
    output: str = ""
    cpu: CpuUse | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.duration_s if self.duration_s else 0.0


class Loader:
    def __init__(self, kind: str, workdir: Path, bodies: Sequence[str]) -> None:
        self.kind = kind
        self.bodies = list(bodies)
        self.script = workdir / "heartbeat.lua"
        lua_bodies = ",\n".join(json.dumps(b) for b in self.bodies)  # JSON string = Lua string
        self.script.write_text(WRK_LUA % {"bodies": lua_bodies, "path": ENDPOINT})

    @property
    def in_process(self) -> bool:
        return self.kind == "python"

    def run(self, url: str, connections: int, duration: float) -> Load:
        if self.kind == "wrk":
            return self._wrk(url, connections, duration)
        return asyncio.run(python_load(url, self.bodies, connections, duration))

    def _wrk(self, url: str, connections: int, duration: float) -> Load:
        seconds = max(1, round(duration))
        command = ["wrk", f"-t{THREADS}", f"-c{connections}", f"-d{seconds}s", "--latency"]
        proc = subprocess.Popen(
            [*command, "-s", str(self.script), url],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = proc.communicate(timeout=seconds + 60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            raise BenchError(f"wrk exited {proc.returncode}:\n{output}")
        return parse_wrk(output, connections)


def parse_wrk(output: str, connections: int) -> Load:
    match = re.search(r"^BENCH-RESULT (\{.*\})$", output, re.MULTILINE)
    if match is None:
        raise BenchError(f"wrk printed no result line:\n{output}")
    r = json.loads(match.group(1))
    text_rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.MULTILINE)
    load = Load(
        loader="wrk",
        connections=connections,
        requests=r["requests"],
        duration_s=r["duration_us"] / 1e6,
        p50_ms=r["p50_us"] / 1e3,
        p90_ms=r["p90_us"] / 1e3,
        p99_ms=r["p99_us"] / 1e3,
        max_ms=r["max_us"] / 1e3,
        mean_ms=r["mean_us"] / 1e3,
        non_2xx=r["status"],
        socket_errors={k: r[k] for k in ("connect", "read", "write", "timeout")},
        output="\n".join(line for line in output.splitlines() if "BENCH-RESULT" not in line),
    )
    if text_rps and abs(float(text_rps.group(1)) - load.rps) > 0.01 * load.rps + 1:
        raise BenchError(f"wrk's Requests/sec {text_rps.group(1)} disagrees with {load.rps:.2f}")
    return load


async def python_load(url: str, bodies: Sequence[str], connections: int, duration: float) -> Load:
    """Closed loop over keep-alive HTTP/1.1 connections; each stops after its last answer, so
    nothing is in flight at the end and every counted request is a completed one."""
    host, port = "127.0.0.1", int(url.split(":")[2].split("/")[0])
    requests = [
        (
            f"POST {ENDPOINT} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n{b}"
        ).encode()
        for b in bodies
    ]
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    started = time.perf_counter()
    deadline = started + duration

    async def connection(offset: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = offset
        try:
            while time.perf_counter() < deadline:
                sent = time.perf_counter()
                writer.write(requests[i % len(requests)])
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                latencies.append(time.perf_counter() - sent)
                statuses[int(head.split(b" ", 2)[1])] += 1
                i += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection(n * 137) for n in range(connections)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    ms = [x * 1e3 for x in latencies] or [0.0]
    return Load(
        loader="python",
        connections=connections,
        requests=len(latencies),
        duration_s=elapsed,
        p50_ms=percentile(ms, 50),
        p90_ms=percentile(ms, 90),
        p99_ms=percentile(ms, 99),
        max_ms=ms[-1],
        mean_ms=statistics.fmean(ms),
        non_2xx=sum(n for status, n in statuses.items() if not 200 <= status < 300),
        socket_errors={},
    )


def combine(loads: Sequence[Load]) -> Load:
    """Several timed runs of one endpoint as one: counts and CPU summed, latency percentiles the
    median of the runs' (the worst run's p99 is `Round`-level), max the largest."""
    first = loads[0]
    requests = sum(x.requests for x in loads)
    cpu = None
    if all(x.cpu is not None for x in loads):
        parts = [x.cpu for x in loads if x.cpu is not None]
        postgres = [c.postgres for c in parts]
        cpu = CpuUse(
            wall=sum(c.wall for c in parts),
            server=sum(c.server for c in parts),
            server_sys=sum(c.server_sys for c in parts),
            postgres=None if None in postgres else sum(c for c in postgres if c is not None),
            loader=sum(c.loader for c in parts),
            machine=sum(c.machine for c in parts),
            cores=parts[0].cores,
        )
    errors: Counter[str] = Counter()
    for x in loads:
        errors.update(x.socket_errors)
    return Load(
        loader=first.loader,
        connections=first.connections,
        requests=requests,
        duration_s=sum(x.duration_s for x in loads),
        p50_ms=statistics.median(x.p50_ms for x in loads),
        p90_ms=statistics.median(x.p90_ms for x in loads),
        p99_ms=statistics.median(x.p99_ms for x in loads),
        max_ms=max(x.max_ms for x in loads),
        mean_ms=sum(x.mean_ms * x.requests for x in loads) / requests if requests else 0.0,
        non_2xx=sum(x.non_2xx for x in loads),
        socket_errors=dict(errors),
        output="\n".join(x.output for x in loads if x.output),
        cpu=cpu,
    )


def percentile(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def choose_loader(requested: str, workdir: Path, bodies: Sequence[str]) -> tuple[Loader, str]:
    """wrk when present (apt-get install when missing), else the asyncio fallback."""
    if requested == "python":
        return Loader("python", workdir, bodies), "python asyncio loader (requested)"
    if shutil.which("wrk") is None:
        note = install_wrk()
        if shutil.which("wrk") is None:
            if requested == "wrk":
                raise BenchError(f"wrk is not available: {note}")
            return Loader("python", workdir, bodies), f"python asyncio loader (wrk: {note})"
    return Loader("wrk", workdir, bodies), wrk_version()


def install_wrk() -> str:
    if shutil.which("apt-get") is None:
        return "not installed, no apt-get"
    print("wrk not found: apt-get install -y wrk ...", flush=True)
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "wrk"]):
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            return f"`{' '.join(command)}` failed: {done.stderr.strip().splitlines()[-1:]}"
    return "installed with apt-get"


def wrk_version() -> str:
    done = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False)
    first = (done.stdout or done.stderr).strip().splitlines()
    return first[0].split(" [")[0] if first else "wrk"


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class Durability:
    completed: int  # responses the load generator counted (all 2xx when non_2xx == 0)
    rows_at_exit: int  # HEARTBEAT rows right after the load generator exited
    rows_final: int  # once the in-flight requests have been committed
    quiesce_s: float
    tolerance: int  # requests possibly in flight when the load generator stopped
    batches: list[int]
    commits: int

    @property
    def extra(self) -> int:
        return self.rows_final - self.completed

    def problems(self, load: Load) -> list[str]:
        found = []
        if load.non_2xx:
            found.append(f"{load.non_2xx} non-2xx answers")
        if any(load.socket_errors.values()):
            found.append(f"socket errors {load.socket_errors}")
        if self.rows_at_exit < self.completed:
            found.append(
                f"{self.completed - self.rows_at_exit} answered requests had no committed row "
                "when the load generator exited"
            )
        if not 0 <= self.extra <= self.tolerance:
            found.append(
                f"{self.rows_final} rows for {self.completed} answers "
                f"(difference {self.extra}, allowed 0..{self.tolerance})"
            )
        return found


@dataclass
class Profile:
    label: str
    samples: int
    seconds: float
    requests: float  # completed during the sampled window (rate x seconds)
    shares: dict[str, float]  # main-thread category -> share of samples
    threads: int
    top_self: list[tuple[str, float]] = field(default_factory=list)


def merge(rounds: Sequence[Durability]) -> Durability:
    """The rounds' durability figures summed, for the totals printed."""
    return Durability(
        completed=sum(d.completed for d in rounds),
        rows_at_exit=sum(d.rows_at_exit for d in rounds),
        rows_final=sum(d.rows_final for d in rounds),
        quiesce_s=max(d.quiesce_s for d in rounds),
        tolerance=sum(d.tolerance for d in rounds),
        batches=sorted(size for d in rounds for size in d.batches),
        commits=sum(d.commits for d in rounds),
    )


@dataclass
class Round:
    """A no-op run and a conductor run, back to back."""

    noop: Load
    conductor: Load
    durability: Durability

    @property
    def ratio(self) -> float:
        return self.conductor.rps / self.noop.rps if self.noop.rps else 0.0


@dataclass
class Report:
    rounds: list[Round]
    profiles: list[Profile] = field(default_factory=list)
    writer: list[dict[str, float]] = field(default_factory=list)
    round_trip_ms: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def noop(self) -> Load:
        return combine([r.noop for r in self.rounds])

    @property
    def conductor(self) -> Load:
        return combine([r.conductor for r in self.rounds])

    @property
    def ratio(self) -> float:
        """The median of the rounds' ratios: each pairs runs a few seconds apart, so a slow
        stretch of the machine weighs on both sides of a ratio, and an outlier round on none."""
        return statistics.median(r.ratio for r in self.rounds)

    def problems(self) -> list[str]:
        found = []
        for n, r in enumerate(self.rounds, 1):
            found += [f"round {n}: {p}" for p in r.durability.problems(r.conductor)]
        return found


def timed_load(loader: Loader, server: Server, db: Db, connections: int, duration: float) -> Load:
    before = snapshot(db, server.pid, loader.in_process)
    load = loader.run(server.url, connections, duration)
    after = snapshot(db, server.pid, loader.in_process)
    load.cpu = cpu_between(before, after)
    return load


def measure_conductor(
    loader: Loader, server: Server, db: Db, connections: int, duration: float
) -> tuple[Load, Durability]:
    db.wait_quiet()  # the warm-up's last requests commit before the TRUNCATE
    db.truncate()
    commits_before = db.commits()
    load = timed_load(loader, server, db, connections, duration)
    rows_at_exit = db.heartbeat_rows()
    rows_final, waited = db.wait_quiet()
    durability = Durability(
        completed=load.requests,
        rows_at_exit=rows_at_exit,
        rows_final=rows_final,
        quiesce_s=waited,
        tolerance=0 if loader.in_process else connections,
        batches=db.batch_sizes(),
        commits=db.commits() - commits_before,
    )
    return load, durability


def measure_round(
    n: int, loader: Loader, noop: Server, conductor: Server, db: Db, args: argparse.Namespace
) -> Round:
    """Round `n`: even rounds load the no-op first, odd rounds the conductor, so a machine
    speeding up or slowing down during the run favours neither side."""

    if n % 2 == 0:
        noop_load = timed_load(loader, noop, db, args.connections, args.duration)
        load, durability = measure_conductor(loader, conductor, db, args.connections, args.duration)
    else:
        load, durability = measure_conductor(loader, conductor, db, args.connections, args.duration)
        noop_load = timed_load(loader, noop, db, args.connections, args.duration)
    return Round(noop_load, load, durability)


@dataclass(frozen=True)
class CpuPlan:
    server: frozenset[int] | None  # each server process is pinned here
    loader: frozenset[int] | None  # the benchmark process and wrk
    note: str


def plan_cpus(pin: bool) -> CpuPlan:
    """One core for the server under load (one at a time is), the others for the load
    generator. Both endpoints get the same placement; PostgreSQL is left to the scheduler."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not pin:
        return CpuPlan(None, None, "not pinned (--no-pin): the scheduler places every process")
    if len(cores) < 2:
        return CpuPlan(None, None, f"not pinned: {len(cores) or 'unknown'} core(s) available")
    server, loader = frozenset(cores[-1:]), frozenset(cores[:-1])
    return CpuPlan(
        server,
        loader,
        f"each server on core {cores[-1]}, the load generator on core(s) "
        f"{','.join(map(str, cores[:-1]))}, PostgreSQL wherever the scheduler puts it",
    )


def run(args: argparse.Namespace, workdir: Path) -> Report:
    database_url = os.environ.get("RIG_BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL", DEFAULT_REDIS_URL)
    bodies = heartbeat_bodies()
    cpus = plan_cpus(not args.no_pin)
    if cpus.loader is not None:
        os.sched_setaffinity(0, cpus.loader)  # wrk and the asyncio loader inherit it
    loader, loader_note = choose_loader(args.loader, workdir, bodies)
    ensure_database(database_url)
    migrate(database_url, redis_url, workdir)
    db = Db(database_url)
    try:
        db.truncate()
        print_header(args, loader_note, db, database_url, cpus.note)
        conductor, noop = make_servers(database_url, redis_url, workdir, cpus.server)
        with running([conductor, noop]):
            for server in (conductor, noop):
                server.wait_ready(bodies[0])
            for server in (noop, conductor):
                loader.run(server.url, args.connections, args.warmup)
            if args.wait_idle > 0:
                print(wait_for_idle_machine(args.wait_idle), flush=True)
            print(
                f"measuring: {args.rounds} rounds of no-op then conductor, {args.duration:g}s each",
                flush=True,
            )
            report = Report(
                [measure_round(n, loader, noop, conductor, db, args) for n in range(args.rounds)]
            )
            if args.profile:
                report.profiles = profile_servers(args, loader, workdir, [noop, conductor])
        if args.profile:
            report.writer, report.round_trip_ms = asyncio.run(writer_alone(database_url))
        for server in (conductor, noop):
            # uvicorn.Server re-raises the SIGTERM it handled; `serve` exits 0 instead.
            if server.exit_code not in (0, -signal.SIGTERM, None):
                report.notes.append(
                    f"{server.name} exited {server.exit_code}:\n{server.log_tail()}"
                )
        return report
    finally:
        db.close()


def make_servers(
    database_url: str, redis_url: str, workdir: Path, cpus: frozenset[int] | None
) -> tuple[Server, Server]:
    conductor_port, noop_port = free_port(), free_port()
    conductor = Server(
        name="conductor",
        command=[*conductor_command(), "serve"],
        env=server_env(database_url, redis_url, conductor_port),
        port=conductor_port,
        log_path=workdir / "conductor.log",
        cwd=workdir,
        cpus=cpus,
    )
    noop_env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    noop = Server(
        name="no-op",
        command=[sys.executable, str(BENCH_DIR / "noop_app.py"), "--port", str(noop_port)],
        env=noop_env,
        port=noop_port,
        log_path=workdir / "noop.log",
        cwd=workdir,
        cpus=cpus,
    )
    return conductor, noop


# --------------------------------------------------------------------------------------------
# Profiling (--profile): py-spy on each server under the same load, and the writer alone

# Main-thread samples by what the event loop was doing: the first rule with a marker in one of
# the stack's "function|file" strings wins. Only the heartbeat writer talks to PostgreSQL here,
# on a psycopg connection of its own; a request waiting for its batch shows as
# "HeartbeatWriter.submit" when it is resumed.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("event loop idle (epoll wait)", ("EpollSelector.select|",)),
    ("writer: psycopg (query parse/send/recv)", ("/psycopg/",)),
    ("writer: batching, commit hook, futures", ("HeartbeatWriter.", "record_heartbeats_on|")),
    (
        "sync dependencies via threadpool",
        (
            "run_in_threadpool|",
            "run_sync_in_worker_thread|",
            "WorkerThread._report_result|",
            "BaseSelectorEventLoop._read_from_self|",
        ),
    ),
    (
        "body read + pydantic validation",
        ("request_body_to_args|", "Request.body|", "Request.json|", "_validate_value", "/pydantic"),
    ),
    ("response render + send", ("Response.__call__|", "JSONResponse.render|")),
    ("FastAPI/Starlette routing + middleware", ("RequestResponseCycle.run_asgi|",)),
    ("HTTP parsing (uvicorn h11) + socket I/O", ("H11Protocol.", "_SelectorSocketTransport.")),
)
OTHER = "other (asyncio machinery, GC, ...)"


def classify(frames: Sequence[str]) -> str:
    for label, markers in CATEGORIES:
        if any(marker in frame for frame in frames for marker in markers):
            return label
    return OTHER


def py_spy() -> str | None:
    local = BIN_DIR / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def profile_servers(
    args: argparse.Namespace, loader: Loader, workdir: Path, servers: Sequence[Server]
) -> list[Profile]:
    tool = py_spy()
    Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    if tool is None:
        print("--profile: py-spy not found (.venv/bin/pip install py-spy); skipped")
        return []
    profiles = []
    for server in servers:
        out = Path(args.profile_dir) / f"{server.name}.speedscope.json"
        seconds = max(2, round(args.duration))
        print(f"profiling {server.name}: py-spy record {seconds}s under the same load", flush=True)
        spy = [tool, "record", "--idle", "-r", str(PROFILE_RATE_HZ), "-d", str(seconds)]
        spy += ["-p", str(server.pid), "--format", "speedscope", "-o", str(out)]
        with concurrent_load(loader, server, args.connections, seconds + 3) as result:
            time.sleep(1.0)
            done = subprocess.run(spy, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            print(f"py-spy failed ({done.returncode}): {done.stderr.strip()[-300:]}")
            continue
        profiles.append(read_profile(server.name, out, result[0]))
        print(f"  {out}")
    return profiles


@contextlib.contextmanager
def concurrent_load(
    loader: Loader, server: Server, connections: int, duration: float
) -> Iterator[list[Load]]:
    """Runs the load in a thread for `duration`; the list holds its result afterwards."""
    import threading

    result: list[Load] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            result.append(loader.run(server.url, connections, duration))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        thread.join(duration + 90)
    if failure:
        raise BenchError(f"load during profiling failed: {failure[0]}")


def read_profile(label: str, path: Path, load: Load) -> Profile:
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]
    main = next(p for p in data["profiles"] if "MainThread" in p["name"])
    shares: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0.0
    for stack, weight in zip(main["samples"], main["weights"], strict=True):
        names = [f"{frames[i]['name']}|{frames[i]['file']}" for i in stack]
        shares[classify(names)] += weight
        total += weight
        if stack and not any(n.startswith("EpollSelector.select|") for n in names):
            f = frames[stack[-1]]
            where = re.sub(r".*/(site-packages|python3\.\d+|src)/", "", f["file"])
            leaf[f"{f['name']} ({where})"] += weight
    total = total or 1.0
    seconds = sum(main["weights"])
    return Profile(
        label=label,
        samples=len(main["samples"]),
        seconds=seconds,
        requests=load.rps * seconds,
        shares={k: v / total for k, v in shares.items()},
        threads=len(data["profiles"]),
        top_self=[(k, v / total) for k, v in leaf.most_common(8)],
    )


async def writer_alone(database_url: str) -> tuple[list[dict[str, float]], float]:
    """`record_heartbeats_on` on its own, in this process, on a connection made the way the
    heartbeat writer makes its own (`connect_direct`): wall ms and client CPU ms per batch, for
    a few batch sizes, and the SELECT 1 round trip."""
    from rig_conductor.adapters.postgres import queries
    from rig_conductor.domain import AgentId, ConsumerName

    bodies = [json.loads(b) for b in heartbeat_bodies()]
    beats = [
        queries.HeartbeatIn(AgentId(b["agentId"]), ConsumerName(b["consumer"])) for b in bodies
    ]
    rows: list[dict[str, float]] = []
    conn = await queries.connect_direct(database_url)
    try:
        rtt = []
        for _ in range(200):
            started = time.perf_counter()
            await conn.execute(b"SELECT 1")
            rtt.append(time.perf_counter() - started)
        for size in (1, 8, 16, 32):
            wall, cpu = [], []
            for n in range(60):
                batch = [beats[(n * size + k) % len(beats)] for k in range(size)]
                started, started_cpu = time.perf_counter(), time.process_time()
                await queries.record_heartbeats_on(conn, tenant="default", heartbeats=batch)
                wall.append(time.perf_counter() - started)
                cpu.append(time.process_time() - started_cpu)
            rows.append(
                {
                    "size": size,
                    "ms": statistics.median(wall[10:]) * 1e3,
                    "cpu_ms": statistics.median(cpu[10:]) * 1e3,
                }
            )
    finally:
        await conn.close()
    return rows, statistics.median(rtt[20:]) * 1e3


# --------------------------------------------------------------------------------------------
# Output


def print_header(
    args: argparse.Namespace, loader_note: str, db: Db, url: str, cpu_note: str
) -> None:
    import fastapi
    import pydantic
    import sqlalchemy
    import uvicorn

    load1, load5, _ = os.getloadavg()
    print("rig-conductor heartbeat ingest benchmark")
    print(
        f"  machine   {os.cpu_count()} cores, {platform.python_implementation()} "
        f"{platform.python_version()}, load average {load1:.2f} / {load5:.2f} (1 / 5 min)"
    )
    print(
        f"  stack     fastapi {fastapi.__version__}, uvicorn {uvicorn.__version__} "
        f"(one worker, asyncio loop, h11), pydantic {pydantic.__version__}, "
        f"sqlalchemy {sqlalchemy.__version__}, psycopg {psycopg.__version__}"
    )
    print(f"  database  PostgreSQL {db.version()} at {make_url(url).render_as_string()}")
    print(f"  loader    {loader_note}")
    print(f"  cores     {cpu_note}")
    print(
        f"  load      {args.connections} connections, {THREADS} threads, {args.rounds} rounds "
        f"of {args.duration:g}s per endpoint, alternating, after a {args.warmup:g}s warm-up; "
        f"HEARTBEAT bodies over {len(AGENTS)} agents / {len(AGENTS) * PODS_PER_AGENT} consumers"
    )
    print(flush=True)


def print_report(report: Report, args: argparse.Namespace) -> int:
    noop, conductor = report.noop, report.conductor
    d = merge([r.durability for r in report.rounds])
    if args.show_wrk:
        for label, load in (("no-op", noop), ("conductor", conductor)):
            if load.output:
                print(f"--- {label}: {load.loader} output")
                print(load.output.rstrip())
        print()
    print_rounds(report.rounds)
    print(
        f"all rounds ({args.rounds} x {args.duration:g}s per endpoint; latency: median of the "
        "rounds')"
    )
    print(
        f"{'endpoint':<11}{'req/s':>9}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'max ms':>9}", end=""
    )
    print(f"{'requests':>10}{'non-2xx':>9}{'sock err':>9}")
    for label, load in (("no-op", noop), ("conductor", conductor)):
        errors = sum(load.socket_errors.values())
        print(
            f"{label:<11}{load.rps:>9,.0f}{load.p50_ms:>9.1f}{load.p90_ms:>9.1f}"
            f"{load.p99_ms:>9.1f}{load.max_ms:>9.1f}{load.requests:>10,}{load.non_2xx:>9}"
            f"{errors:>9}"
        )
    total = conductor.rps / noop.rps if noop.rps else 0.0
    print(
        f"ratio conductor / no-op: {report.ratio:.2f} (median of the rounds' ratios; "
        f"all requests of all rounds: {total:.2f})"
    )
    print()
    print_cpu(noop, conductor)
    print_batches(conductor, d)
    problems = report.problems()
    print_durability(conductor, d, problems)
    worst_p99 = max(r.conductor.p99_ms for r in report.rounds)
    print_goals(report.ratio, worst_p99, problems)
    if report.profiles:
        print_profiles(report.profiles, {"no-op": noop.rps, "conductor": conductor.rps})
    if report.writer:
        print_writer(report.writer, report.round_trip_ms)
    return 1 if problems else 0


def print_rounds(rounds: Sequence[Round]) -> None:
    print("rounds: a no-op run and a conductor run back to back (rounds 1, 3, ... no-op first)")
    print(f"{'round':<7}{'no-op req/s':>13}{'conductor req/s':>17}{'ratio':>7}{'p99 ms':>15}")
    for n, r in enumerate(rounds, 1):
        p99 = f"{r.noop.p99_ms:.1f} / {r.conductor.p99_ms:.1f}"
        print(f"{n:<7}{r.noop.rps:>13,.0f}{r.conductor.rps:>17,.0f}{r.ratio:>7.2f}{p99:>15}")
    print()


def print_cpu(noop: Load, conductor: Load) -> None:
    if noop.cpu is None or conductor.cpu is None:
        return
    print(
        f"CPU during each timed run: cores busy (of {noop.cpu.cores}) [CPU us per request]; "
        "server sys = kernel share of the server's time"
    )
    print(
        f"{'endpoint':<11}{'server':>16}{'server sys':>12}{'postgres':>16}{'loader':>16}"
        f"{'other procs':>13}"
    )
    busy_elsewhere = []
    for label, load in (("no-op", noop), ("conductor", conductor)):
        cpu = load.cpu
        assert cpu is not None

        def cell(seconds: float | None, cpu: CpuUse = cpu, load: Load = load) -> str:
            if seconds is None:
                return f"{'n/a':>16}"
            per = seconds / load.requests * 1e6 if load.requests else 0.0
            return f"{seconds / cpu.wall:>7.2f} [{per:>5.0f} us]"

        sys_share = cpu.server_sys / cpu.server if cpu.server else 0.0
        print(f"{label:<11}{cell(cpu.server)}{sys_share:>12.0%}", end="")
        print(f"{cell(cpu.postgres)}{cell(cpu.loader)}{cpu.other / cpu.wall:>13.2f}")
        if cpu.other / cpu.wall > OTHER_LOAD_WARN:
            busy_elsewhere.append(f"{label} {cpu.other / cpu.wall:.2f}")
    if busy_elsewhere:
        print(
            "  WARNING: other processes kept cores busy during the run "
            f"({', '.join(busy_elsewhere)} cores): the numbers are lower than on a quiet "
            "machine and the ratio is skewed"
        )
    print()


def print_batches(load: Load, d: Durability) -> None:
    sizes = d.batches
    if not sizes:
        return
    n = sum(sizes)
    mean = n / len(sizes)
    weighted = sum(s * s for s in sizes) / n
    cycle_ms = load.duration_s / len(sizes) * 1e3
    print(
        f"writer batches (distinct occurred_at): {len(sizes):,} transactions, "
        f"{len(sizes) / load.duration_s:,.0f}/s, one every {cycle_ms:.1f} ms; size mean "
        f"{mean:.1f}, median {statistics.median(sizes):g}, p90 {percentile(sizes, 90):g}, "
        f"max {sizes[-1]}; a heartbeat's batch averages {weighted:.1f}"
    )
    print(f"  PostgreSQL commits in the database during the run: {d.commits:,}")
    print()


def print_durability(load: Load, d: Durability, problems: list[str]) -> None:
    print(
        f"durability: {load.requests:,} answers counted by {load.loader} (non-2xx "
        f"{load.non_2xx}); HEARTBEAT rows {d.rows_at_exit:,} when it exited, {d.rows_final:,} "
        f"after {d.quiesce_s:.1f}s (+{d.extra}: requests in flight when it stopped, "
        f"allowed 0..{d.tolerance})"
    )
    verdict = "OK" if not problems else "FAILED: " + "; ".join(problems)
    print(f"  every answered heartbeat committed: {verdict}")
    print()


def print_goals(ratio: float, worst_p99_ms: float, problems: list[str]) -> None:
    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print("goals")
    print(
        f"  conductor / no-op >= {GOAL_RATIO:.2f} (median of rounds): {ratio:.2f}  "
        f"{mark(ratio >= GOAL_RATIO)}"
    )
    print(
        f"  conductor p99 <= {GOAL_P99_MS:.0f} ms (worst round): {worst_p99_ms:.1f} ms  "
        f"{mark(worst_p99_ms <= GOAL_P99_MS)}"
    )
    print(f"  every 202 durable: {mark(not problems)}")
    print()


def print_profiles(profiles: Sequence[Profile], timed_rps: dict[str, float]) -> None:
    """Shares of main-thread samples, and the same shares of the main thread's wall time per
    request at the timed run's rate (py-spy pauses the process to sample: the profiled runs are
    slower, the shares much less affected)."""
    print(
        f"main-thread profile (py-spy --idle, {PROFILE_RATE_HZ} Hz, same load): share of "
        "samples, and that share of 1 / (timed run's req/s) in us per request"
    )
    labels = [label for label, _ in CATEGORIES] + [OTHER]
    print(f"{'':<42}" + "".join(f"{p.label:>20}" for p in profiles))
    for label in labels:
        cells = ""
        for p in profiles:
            share = p.shares.get(label, 0.0)
            rps = timed_rps.get(p.label, 0.0)
            cells += f"{share:>10.1%} {share / rps * 1e6 if rps else 0.0:>6.0f} us"
        print(f"{label:<42}{cells}")
    totals = "".join(f"{1e6 / timed_rps[p.label]:>17.0f} us" for p in profiles)
    print(f"{'total (1 / timed req/s)':<42}{totals}")
    rates = "".join(f"{p.requests / p.seconds:>16,.0f} r/s" for p in profiles)
    print(f"{'req/s while py-spy sampled':<42}{rates}")
    for p in profiles:
        print(f"  {p.label}: {p.threads} threads sampled; busiest own-time frames (main thread):")
        for name, share in p.top_self:
            print(f"    {share:6.1%}  {name}")
    print()


def print_writer(rows: Sequence[dict[str, float]], rtt_ms: float | None) -> None:
    print(
        "record_heartbeats_on alone (in the benchmark process, nothing else on its event loop, "
        f"on a connection like the writer's: one round trip per batch); SELECT 1 round trip "
        f"{rtt_ms:.2f} ms"
    )
    print(f"{'batch':>7}{'ms/batch':>10}{'client CPU ms':>15}{'heartbeats/s ceiling':>22}")
    for row in rows:
        print(
            f"{row['size']:>7.0f}{row['ms']:>10.2f}{row['cpu_ms']:>15.2f}"
            f"{row['size'] / row['ms'] * 1e3:>22,.0f}"
        )
    print()


# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration", type=float, default=3.0, help="seconds per endpoint and round (default 3)"
    )
    parser.add_argument("--rounds", type=int, default=10, help="no-op/conductor pairs (default 10)")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave every process to the scheduler (default: one core for the server)",
    )
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=None, help="seconds (default 2, quick 1)")
    parser.add_argument(
        "--quick", action="store_true", help="2 rounds of 3 s per endpoint, 1 s warm-up"
    )
    parser.add_argument(
        "--loader", choices=("auto", "wrk", "python"), default="auto", help="default: wrk if any"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then py-spy each server under the same load, and time record_heartbeats alone",
    )
    parser.add_argument(
        "--profile-dir",
        default=os.path.join(tempfile.gettempdir(), "rig-ingest-profile"),
        help="where --profile leaves the speedscope files (default: %(default)s)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before measuring, wait up to S seconds for other processes to go quiet",
    )
    parser.add_argument("--show-wrk", action="store_true", help="print wrk's own output")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.rounds = 3.0, 2
    if args.warmup is None:
        args.warmup = 1.0 if args.quick else 2.0
    if args.connections < 1 or args.duration <= 0 or args.rounds < 1:
        parser.error("--connections, --duration and --rounds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    try:
        with terminate_on_sigterm(), tempfile.TemporaryDirectory(prefix="rig-ingest-") as tmp:
            report = run(args, Path(tmp))
            status = print_report(report, args)
    except (BenchError, psycopg.Error) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130
    for note in report.notes:
        print(f"note: {note}")
    print(f"run time {time.monotonic() - started:.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
