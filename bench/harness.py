"""What the benchmarks share: the servers, data sets planted in them, `rig-conductor` run as
users run it (a subprocess, its stderr read through a pipe) and the way results are printed.
It measures nothing itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import psycopg
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import intake
from rig_conductor.domain import AgentId, ConsumerName

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests/ helpers
from tests import redis_kit

CLI = Path(sys.executable).with_name("rig-conductor")
COMMAND = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "rig_conductor"]
GROUP = "g"
TENANT = "default"
RECLAIMED = "[StreamReclaim] Reclaimed"

# Dead agents' ids extend live ones, so every consumer name goes through the longest-prefix
# resolution (review-e-codex-rig-agent-runtime-0 belongs to review-e-codex, not review-e).
LIVE_AGENTS = ("review-e", "dev-e", "test-e", "docs-e", "ops-e")
LIVE_AGENTS += ("qa-e", "sec-e", "perf-e", "arch-e", "triage-e")
_VARIANTS = ("codex", "dotnet", "py", "ja", "eu", "mobile", "scan", "load", "rfc", "bot")
DEAD_AGENTS = tuple(f"{a}-{v}" for a, v in zip(LIVE_AGENTS, _VARIANTS, strict=True))

_DATA_TABLES = (  # every table but alembic_version
    "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = current_schema() "
    "AND tablename <> 'alembic_version'"
)
# XREADGROUP run server-side: delivering a million entries does not ship them to the client.
_DELIVER_LUA = """
local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
                     'STREAMS', KEYS[1], '>')
if not r then return 0 end
return #r[1][2]
"""


class BenchError(RuntimeError):
    """A benchmark could not run, or a result failed its check: one line, exit 1."""


def run(main: Coroutine[Any, Any, int] | Callable[[], int]) -> int:
    """`main`'s exit code (a coroutine is run, a function called); a BenchError: exit 1."""
    try:
        return asyncio.run(main) if isinstance(main, Coroutine) else main()
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        return 1


def options(parser: argparse.ArgumentParser, **defaults: tuple[Any, Any]) -> argparse.Namespace:
    """The command line, each of `defaults` (name: (full run, --quick)) filled in if not given."""
    args = parser.parse_args()
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


# Servers
def conninfo(url: str, database: str | None = None) -> str:
    """The libpq form of a SQLAlchemy URL (psycopg takes postgresql://...)."""
    target = make_url(url).set(drivername="postgresql")
    if database is not None:
        target = target.set(database=database)
    return target.render_as_string(hide_password=False)


def ensure_database(url: str) -> None:
    """CREATE DATABASE <name> through the server's `postgres` database when it is missing."""
    name = make_url(url).database
    if not name:
        raise BenchError("RIG_BENCH_DATABASE_URL names no database")
    with psycopg.connect(conninfo(url, "postgres"), autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if found is None:
            quoted = name.replace('"', '""')
            conn.execute(f'CREATE DATABASE "{quoted}"'.encode())


@dataclass(frozen=True)
class Servers:
    redis_url: str
    database_url: str
    origin: str  # "configured" or "embedded"


@contextlib.contextmanager
def servers(redis_url: str | None = None, database_url: str | None = None) -> Iterator[Servers]:
    """RIG_BENCH_REDIS_URL and RIG_BENCH_DATABASE_URL, else the URLs given, else an embedded Redis
    and PostgreSQL in a temporary directory; the database created when missing and migrated."""
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL", redis_url)
    database_url = os.environ.get("RIG_BENCH_DATABASE_URL", database_url)
    with contextlib.ExitStack() as stack:
        origin = "configured"
        if database_url:
            ensure_database(database_url)
        if not (redis_url and database_url):
            from rig_conductor.embedded import embedded_services

            embedded = stack.enter_context(embedded_services())
            redis_url = redis_url or embedded.redis_url
            database_url = database_url or embedded.database_url
            origin = "embedded"
        from rig_conductor.adapters.postgres import migrations  # alembic: only when needed

        migrations.upgrade(database_url)
        yield Servers(redis_url, database_url, origin)


@dataclass
class Stores:
    """Clients of the servers. The benchmark owns them: `reset` empties both."""

    servers: Servers
    redis: Redis
    engine: AsyncEngine

    async def reset(self) -> None:
        """FLUSHDB, and TRUNCATE every table but alembic_version."""
        await self.redis.flushdb()
        async with self.engine.begin() as conn:
            tables = await conn.execute(text(_DATA_TABLES))
            await conn.execute(text(f"TRUNCATE {', '.join(tables.scalars())}"))

    async def check_reclaimed(self, expected: int, reported: int, lines: int) -> None:
        """A reclaim of `expected` entries: the report's count, the RECLAIMED lines read and the
        entries of the event log's RECLAIMED rows (a row carries a batch of ids) all equal it."""
        sql = "SELECT coalesce(sum(coalesce(cardinality(entry_ids), 1)), 0) FROM events WHERE "
        async with self.engine.connect() as conn:
            rows = await conn.execute(text(sql + "kind = 'RECLAIMED'"))
            recorded = int(rows.scalar_one())
        if not reported == lines == recorded == expected:
            raise BenchError(
                f"{expected:,} entries to reclaim: the report says {reported:,} reclaimed, "
                f"{lines:,} lines read, {recorded:,} in the event log"
            )


@contextlib.asynccontextmanager
async def stores(title: str) -> AsyncIterator[Stores]:
    """Clients of the servers, named under `title`; both emptied (FLUSHDB) at the end."""
    with servers() as found:
        redis = redis_kit.connect(found.redis_url)
        bench = Stores(found, redis, pg_engine.create_engine(found.database_url))
        try:
            redis_version = (await redis.info("server"))["redis_version"]
            async with bench.engine.connect() as conn:
                pg = (await conn.execute(text("SHOW server_version"))).scalar_one()
            where = f"{found.redis_url}, {make_url(found.database_url)}"
            print(title)
            print(f"  Redis {redis_version}, PostgreSQL {pg} ({found.origin}: {where})", flush=True)
            yield bench
        finally:
            with contextlib.suppress(Exception):
                await bench.reset()
            await redis.aclose()
            await bench.engine.dispose()


# Data sets
async def add_entries(redis: Redis, stream: str, count: int) -> list[str]:
    """`count` dispatch-shaped entries, pipelined 10,000 at a time; their ids in order."""
    ids: list[str] = []
    entry = {"type": "ISSUE_ASSIGNED", "agentId": "bench", "assignedAt": "2026-05-16T09:00:00Z"}
    entry["payload"] = '{"repo":"rig/conductor","pr":959,"kind":"review"}'
    for start in range(0, count, 10_000):
        async with redis.pipeline(transaction=False) as pipe:
            for n in range(start, min(count, start + 10_000)):
                pipe.xadd(stream, {"issueId": f"rc-{n}", **entry})
            ids.extend(await pipe.execute())
    return ids


async def add_consumers(redis: Redis, stream: str, pairs: Sequence[tuple[str, str]]) -> None:
    """XGROUP CREATECONSUMER for the consumers of the (agent, consumer) pairs, pipelined."""
    async with redis.pipeline(transaction=False) as pipe:
        for _, consumer in pairs:
            pipe.xgroup_createconsumer(stream, GROUP, consumer)
        await pipe.execute()


async def deliver(redis: Redis, stream: str, reads: Sequence[tuple[str, int]]) -> None:
    """XREADGROUP GROUP g <consumer> COUNT <n> ... > for each (consumer, n); all must arrive."""
    script = redis.register_script(_DELIVER_LUA)
    todo = [(consumer, n) for consumer, n in reads if n > 0]
    got, expected = 0, sum(n for _, n in todo)
    for start in range(0, len(todo), 200):
        async with redis.pipeline(transaction=False) as pipe:
            for consumer, n in todo[start : start + 200]:
                await script(keys=[stream], args=[GROUP, consumer, n], client=pipe)
            got += sum(int(x) for x in await pipe.execute())
    if got != expected:
        raise BenchError(f"{stream}: delivered {got:,} entries, expected {expected:,}")


async def heartbeat(engine: AsyncEngine, pairs: Sequence[tuple[str, str]]) -> None:
    """One HEARTBEAT per agent and one per consumer of the (agent, consumer) pairs, now."""
    beats = [intake.HeartbeatIn(AgentId(a)) for a in sorted({a for a, _ in pairs})]
    beats += [intake.HeartbeatIn(AgentId(a), ConsumerName(c)) for a, c in pairs]
    for batch in (beats[start : start + 1_000] for start in range(0, len(beats), 1_000)):
        await intake.record_heartbeats(engine, tenant=TENANT, heartbeats=batch)


def consumers(agents: Sequence[str], count: int) -> list[tuple[str, str]]:
    """`count` (agent, `<agent>-rig-agent-runtime-<n>`) pairs, round-robin over `agents`."""
    n = len(agents)
    return [(agents[i % n], f"{agents[i % n]}-rig-agent-runtime-{i // n}") for i in range(count)]


@dataclass(frozen=True)
class Shape:
    """`entries` pending entries held by dead consumers (known agent ids that never heartbeat),
    beside live ones that hold none: half of the `consumers` dead and half alive, or with `spare`
    (spec `E/C+S`) all `consumers` dead and `spare` live ones: a dead fleet and its survivors."""

    entries: int
    consumers: int
    spare: int = 0

    @classmethod
    def parse(cls, spec: str) -> Shape:
        sizes, _, spare = spec.partition("+")
        entries, consumers_ = (int(x) for x in sizes.split("/"))
        shape = cls(entries, consumers_, int(spare or 0))
        if consumers_ < 2 or entries % len(shape.dead) or (not shape.spare and consumers_ % 2):
            raise BenchError(f"shape {spec}: entries a multiple of the dead consumers' count")
        return shape

    @property
    def per_consumer(self) -> int:
        """Entries each dead consumer holds."""
        return self.entries // len(self.dead)

    @property
    def stale(self) -> int:
        """Entries held by the dead consumers: what a scan must move."""
        return self.per_consumer * len(self.dead)

    @property
    def dead(self) -> list[tuple[str, str]]:
        count = self.consumers if self.spare else self.consumers // 2
        return consumers(DEAD_AGENTS[:count], count)

    @property
    def live(self) -> list[tuple[str, str]]:
        count = self.spare or self.consumers // 2
        return consumers(LIVE_AGENTS[:count], count)

    @property
    def agent_ids(self) -> str:
        return ",".join(sorted({a for a, _ in self.dead + self.live}))

    def __str__(self) -> str:
        spare = f" + {self.spare:,} live" if self.spare else ""
        return f"{self.entries:,} entries / {self.consumers:,} consumers{spare}"


async def plant(stores: Stores, shape: Shape, stream: str, stale_ms: int) -> None:
    """A fresh data set: every entry read by the dead consumers and idle past `stale_ms`; the live
    consumers registered in the group, holding nothing, their agents and names heartbeating."""
    await stores.reset()
    redis = stores.redis
    await add_entries(redis, stream, shape.entries)
    await redis.xgroup_create(stream, GROUP, id="0")
    await deliver(redis, stream, [(c, shape.per_consumer) for _, c in shape.dead])
    read_at = time.monotonic()
    await heartbeat(stores.engine, shape.live)
    await add_consumers(redis, stream, shape.live)
    await asyncio.sleep(max(0.0, read_at + stale_ms / 1000 + 0.2 - time.monotonic()))


async def verify_moved(stores: Stores, shape: Shape, stream: str, to: set[str]) -> dict[str, int]:
    """After a reclaim: the dead consumers hold nothing, every entry is still pending, with a
    live consumer or one of `to`. Returns the pending count per consumer."""
    summary = await stores.redis.xpending(stream, GROUP)
    pel = {row["name"]: int(row["pending"]) for row in summary.get("consumers") or []}
    left = sum(pel.get(c, 0) for _, c in shape.dead)
    strangers = set(pel) - {c for _, c in shape.live} - to
    if left or strangers or sum(pel.values()) != shape.entries:
        raise BenchError(
            f"after the reclaim: {left:,} entries on dead consumers, unexpected owners "
            f"{sorted(strangers)[:5]}, {sum(pel.values()):,} pending of {shape.entries:,}"
        )
    return pel


# rig-conductor as users run it
def conductor_env(found: Servers, **settings: object) -> dict[str, str]:
    """The caller's environment without its RIG_* variables, plus the servers, Kubernetes off and
    `settings` (name -> RIG_<NAME>): what a user's shell would hand the command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    servers = {"redis_url": found.redis_url, "database_url": found.database_url}
    settings = servers | {"k8s_enabled": "false"} | settings
    return env | {f"RIG_{name.upper()}": str(value) for name, value in settings.items()}


@dataclass
class CliRun:
    seconds: float  # the whole command: start-up, work, every line through the pipe, exit
    stdout: str
    lines: int  # stderr lines carrying the counted marker
    rss_mb: float  # the child's peak RSS


def run_cli(args: Sequence[str], env: dict[str, str]) -> CliRun:
    """`rig-conductor <args>`, stdout and stderr read through pipes (stderr in a thread, counting
    the RECLAIMED lines). The peak RSS is the child's own VmHWM, sampled: wait4's ru_maxrss would
    carry over this process's peak (a child spawned by vfork and exec starts from it)."""
    lines, tail = 0, collections.deque[str](maxlen=5)

    def read(stream: IO[str]) -> None:
        nonlocal lines
        for line in stream:
            if RECLAIMED in line:
                lines += 1
            else:
                tail.append(line)

    started = time.perf_counter()
    with subprocess.Popen(
        [*COMMAND, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        reader = threading.Thread(target=read, args=(child.stderr,))
        reader.start()
        with peaks(lambda: (proc_kb(child.pid).get("VmHWM", 0) / 1024,), every=0.01) as peak:
            stdout = child.stdout.read()
            child.wait()
        reader.join()
    seconds = time.perf_counter() - started
    if child.returncode != 0:
        said = "".join(tail).strip()[-400:]
        raise BenchError(f"rig-conductor {' '.join(args)} exited {child.returncode}: {said}")
    return CliRun(seconds, stdout, lines, peak[0])


async def run_reap(stores: Stores, expected: int, **settings: object) -> tuple[CliRun, Any]:
    """`rig-conductor reap --once` with `settings`: its run and report, `check_reclaimed`."""
    env = conductor_env(stores.servers, **settings)
    run = await asyncio.to_thread(run_cli, ["reap", "--once"], env)
    report = json.loads(run.stdout)
    await stores.check_reclaimed(expected, int(report["reclaimed"]), run.lines)
    return run, report


def proc_kb(pid: int) -> dict[str, int]:
    """The sizes in /proc/<pid>/status (VmHWM, RssAnon, ...) in kB; none once it is gone."""
    with contextlib.suppress(OSError):
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return {k: int(v.split()[0]) for k, _, v in (x.partition(":") for x in lines) if "kB" in v}
    return {}


def _stat(pid: int) -> tuple[int, float] | None:
    """A process's parent and CPU seconds so far; None once it is gone."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return None


def cpu_s(pid: int) -> float:
    """CPU seconds process `pid` has spent so far (0.0 once it is gone)."""
    found = _stat(pid)
    return 0.0 if found is None else found[1]


@contextlib.contextmanager
def postgres_cpu(database_url: str, every: float = 0.05) -> Iterator[list[float]]:
    """The CPU seconds the PostgreSQL server of `database_url` spends while the block runs: its
    postmaster and every process it forks, sampled every `every` s so that a backend which exits
    keeps its share (all but its last interval). The list yielded holds the sum once the block
    ends; 0.0 for a server on another machine."""
    with psycopg.connect(conninfo(database_url)) as conn:  # read while its backend lives
        row = conn.execute("SELECT pg_backend_pid(), inet_server_addr()").fetchone()
        assert row is not None
        backend, address = row
        found = _stat(backend) if address is None or address.is_loopback else None
    if found is None:  # not this machine's: its CPU cannot be read here
        yield [0.0]
        return
    postmaster = found[0]
    last: dict[int, float] = {}  # the latest CPU seen of every process of the server

    def sample() -> None:
        with contextlib.suppress(OSError):
            family = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
            for pid in (postmaster, *map(int, family)):
                if (stat := _stat(pid)) is not None:
                    last[pid] = stat[1]

    sample()
    first = dict(last)  # a process forked during the block starts from 0
    total = [0.0]
    try:
        with every_while(every, sample):
            yield total
    finally:
        sample()
        total[0] = sum(seconds - first.get(pid, 0.0) for pid, seconds in last.items())


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have ended and been waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


async def redis_cpu_s(redis: Redis) -> float:
    """CPU seconds the Redis server has spent since it started (INFO cpu, its own process)."""
    cpu = await redis.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


@contextlib.contextmanager
def peaks(read: Callable[[], Sequence[float]], every: float) -> Iterator[list[float]]:
    """The highest of each value `read` returns while the block runs, read every `every` s."""
    peak = list(read())

    def sample() -> None:
        peak[:] = [max(high, now) for high, now in zip(peak, read(), strict=True)]

    with every_while(every, sample):
        yield peak


@contextlib.contextmanager
def every_while(seconds: float, step: Callable[[], None]) -> Iterator[None]:
    """`step` called every `seconds`, on a thread of its own, while the block runs."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(seconds):
            step()

    sampler = threading.Thread(target=loop, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()


def ensure_installed(package: str, present: Callable[[], bool]) -> None:
    """Debian's `package`, installed with apt-get while `present()` is false, as in CI."""
    for command in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", package]):
        if present() or not shutil.which("apt-get"):
            break
        print(f"{package} not found: {' '.join(command)}", flush=True)
        subprocess.run(command, capture_output=True, check=False, timeout=600)
    if not present():
        raise BenchError(f"{package} is needed: apt-get install {package}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(child: subprocess.Popen[bytes], ready_url: str) -> None:
    """Until `ready_url` answers 200, 60 s at most, while the server process runs."""
    deadline = time.monotonic() + 60
    while child.poll() is None:
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(ready_url, timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise BenchError(f"{ready_url} did not answer 200 within 60 s")
        time.sleep(0.2)
    raise BenchError(f"the server of {ready_url} exited {child.returncode} at start")


@contextlib.contextmanager
def process(
    command: Sequence[str], env: dict[str, str], ready_url: str, log: IO[bytes] | int
) -> Iterator[int]:
    """A server process, once `ready_url` answers 200, until SIGTERM (SIGKILL 40 s later): its
    pid."""
    child = subprocess.Popen(
        command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
    )
    try:
        wait_ready(child, ready_url)
        yield child.pid
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(40)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextlib.contextmanager
def serving(
    env: dict[str, str],
    log: IO[bytes] | int = subprocess.DEVNULL,
    command: Sequence[str] = (*COMMAND, "serve"),
) -> Iterator[tuple[str, int]]:
    """`rig-conductor serve` (or `command`, which serves as it does) on a free port, no scan for
    an hour: its base URL and pid."""
    port = free_port()
    env = {**env, "RIG_HTTP_HOST": "127.0.0.1", "RIG_HTTP_PORT": str(port)}
    env.setdefault("RIG_STARTUP_DELAY_S", "3600")
    env.setdefault("RIG_ALLOW_ANONYMOUS", "true")  # open unless `env` sets tokens
    url = f"http://127.0.0.1:{port}"
    with process(command, env, f"{url}/readyz", log) as pid:
        yield url, pid


@contextlib.contextmanager
def serve(
    env: dict[str, str],
    log: IO[bytes] | int = subprocess.DEVNULL,
    command: Sequence[str] = (*COMMAND, "serve"),
) -> Iterator[str]:
    """`serving`, its base URL only."""
    with serving(env, log, command) as (url, _):
        yield url


# Printing
def goal(label: str, value: float, op: str, target: float, unit: str = "") -> bool:
    """One line: `label` is `value`; the goal (`op` `target`) met or MISSED. Returns which."""
    ok = {">=": value >= target, "<=": value <= target, "<": value < target}[op]
    shown, goal_ = f"{value:,.2f}{unit}", f"{op} {target:,g}{unit}"
    print(f"  goal  {label:<40} {shown:>12}  {goal_:<12} {'met' if ok else 'MISSED'}", flush=True)
    return ok


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


median = statistics.median
