"""Small builders for stream fixtures: dispatch entries and let consumers read them."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
from alembic import command
from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import migrations
from rig_conductor.effects import port as effects_port
from rig_conductor.effects.port import Effects
from rig_conductor.metrics import Metrics
from rig_conductor.settings import Settings


@contextmanager
def fresh_database(database_url: str, prefix: str) -> Iterator[str]:
    """A database of its own, empty (no schema), on the server of `database_url`: its URL.
    Dropped on exit, whatever is still connected."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = make_url(database_url).set(drivername="postgresql", database="postgres")
    conninfo = admin.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@contextmanager
def database_at(database_url: str, prefix: str, revision: str) -> Iterator[str]:
    """A database of its own (`fresh_database`) migrated to `revision`: a migration's test
    starts from the revision before it."""
    with fresh_database(database_url, prefix) as url:
        command.upgrade(migrations.alembic_config(url), revision)
        yield url


@asynccontextmanager
async def engine_on(url: str) -> AsyncIterator[AsyncEngine]:
    """A small engine on `url`, disposed on exit."""
    engine = pg_engine.create_engine(url, pool_size=2)
    try:
        yield engine
    finally:
        await engine.dispose()


async def fill(redis: Redis, stream: str, group: str, n: int, *, start: int = 1) -> list[str]:
    """Create `group` (MKSTREAM) if needed and append n ISSUE_ASSIGNED-like entries."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception as exc:  # BUSYGROUP: already there
        if "BUSYGROUP" not in str(exc):
            raise
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(start, start + n):
            pipe.xadd(stream, {"type": "ISSUE_ASSIGNED", "issueId": f"rc-{i}", "payload": "{}"})
        return list(await pipe.execute())


async def read(redis: Redis, stream: str, group: str, consumer: str, count: int) -> list[str]:
    """`consumer` reads up to `count` new entries (they join its pending list)."""
    replies = await redis.xreadgroup(group, consumer, {stream: ">"}, count=count)
    return [entry_id for _, entries in replies for entry_id, _ in entries]


async def register(redis: Redis, stream: str, group: str, consumer: str) -> None:
    await redis.xgroup_createconsumer(stream, group, consumer)


async def owners(redis: Redis, stream: str, group: str) -> dict[str, str]:
    """entry id -> owning consumer, for the whole pending list."""
    rows = await redis.xpending_range(stream, group, min="-", max="+", count=1_000_000)
    return {row["message_id"]: row["consumer"] for row in rows}


async def wait_for(
    check: Callable[[], object],
    within: float = 15.0,
    *,
    explain: Callable[[], object] | None = None,
) -> None:
    """Poll `check` (plain or async) until it is truthy, or fail after `within` seconds, with
    what `explain` (plain or async) says about the state it was left in."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    said = explain() if explain is not None else ""
    if asyncio.iscoroutine(said):
        said = await said
    raise AssertionError(f"condition not met in time{': ' if said else ''}{said}")


async def eventually(
    check: Callable[[], object], within: float = 15.0, *, every: float = 0.05
) -> None:
    """Run `check` (plain or async) until it stops raising AssertionError, or re-raise its last
    failure after `within` seconds: an assertion waited on, with the assertion's own message."""
    deadline = time.monotonic() + within
    while True:
        try:
            result = check()
            if asyncio.iscoroutine(result):
                await result
            return
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        await asyncio.sleep(every)


async def idle_at_least(
    redis: Redis, stream: str, group: str, ms: int, *, within: float = 15.0
) -> None:
    """Wait until every entry pending in `group` has been idle at least `ms` by Redis' own clock
    (the idle time a scan reads), instead of sleeping for `ms` and hoping the clocks agree."""

    async def idle() -> None:
        rows = await redis.xpending_range(stream, group, min="-", max="+", count=1_000_000)
        assert rows, f"nothing pending in {group} of {stream}"
        least = min(row["time_since_delivered"] for row in rows)
        assert least >= ms, f"least idle {least} ms in {group} of {stream}, waiting for {ms}"

    await eventually(idle, within)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Conductor:
    """A `rig-conductor serve` process. Its output goes to files, never to a pipe: a pipe that
    nobody reads fills up and stalls the conductor's logging, and with it the conductor."""

    url: str
    process: subprocess.Popen[bytes]
    directory: Path
    # What it wrote, kept once it has stopped and its directory is gone.
    final: dict[str, str] = field(default_factory=dict)

    @property
    def stdout(self) -> str:
        return self._output("stdout")

    @property
    def stderr(self) -> str:
        """Everything it has logged so far (and all of it once the context has exited)."""
        return self._output("stderr")

    def _output(self, name: str) -> str:
        if name in self.final:
            return self.final[name]
        return (self.directory / name).read_text(errors="replace")


STOP_TIMEOUT_S = 30.0


@asynccontextmanager
async def serve(redis_url: str, database_url: str, **env: str) -> AsyncIterator[Conductor]:
    """`rig-conductor serve` as a process, ready when yielded; SIGTERM on exit, SIGKILL if it
    has not stopped in time, and collected either way, whether the test passed or not.

    Open (RIG_ALLOW_ANONYMOUS) unless `env` sets tokens or says otherwise."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(
        RIG_REDIS_URL=redis_url,
        RIG_DATABASE_URL=database_url,
        RIG_HTTP_HOST="127.0.0.1",
        RIG_HTTP_PORT=str(port),
        RIG_ALLOW_ANONYMOUS="true",
    )
    environment.update(env)
    with tempfile.TemporaryDirectory(prefix="rig-serve-") as scratch:
        directory = Path(scratch)
        with (directory / "stdout").open("wb") as out, (directory / "stderr").open("wb") as err:
            process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
                [sys.executable, "-m", "rig_conductor", "serve"],
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        conductor = Conductor(f"http://127.0.0.1:{port}", process, directory)
        try:
            async with httpx.AsyncClient(base_url=conductor.url) as client:

                async def ready() -> bool:
                    if process.poll() is not None:
                        raise AssertionError(
                            f"serve exited with {process.returncode}: {conductor.stderr[-3000:]}"
                        )
                    try:
                        return (await client.get("/readyz")).status_code == 200
                    except httpx.TransportError:
                        return False

                async def why() -> str:
                    try:
                        answer = await client.get("/readyz")
                        said = f"/readyz answered {answer.status_code} {answer.text[:500]}"
                    except httpx.TransportError as exc:
                        said = f"/readyz unreachable ({type(exc).__name__})"
                    return f"{said}; serve's stderr ends: {conductor.stderr[-3000:]}"

                await wait_for(ready, within=30, explain=why)
            yield conductor
        finally:
            await asyncio.to_thread(_stop, process)
            conductor.final = {"stdout": conductor.stdout, "stderr": conductor.stderr}


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def heartbeats_stored(engine: AsyncEngine, tenant: str = "default") -> int:
    """Heartbeats the database accounts for: the beats of every agent's open liveness interval
    and of its ended ones (every heartbeat counts for its agent, named consumer or not)."""
    async with engine.connect() as conn:
        stored = await conn.execute(
            text(
                "SELECT (SELECT COALESCE(sum(beats), 0) FROM agent_heartbeats WHERE tenant = :t)"
                " + (SELECT COALESCE(sum(beats), 0) FROM liveness"
                "    WHERE tenant = :t AND consumer IS NULL)"
            ),
            {"t": tenant},
        )
        return int(stored.scalar_one())


def port(
    engine: AsyncEngine, settings: Settings, *, metrics: Metrics | None = None, dry: bool = False
) -> Effects:
    """The write port a scan's entry point hands the scan: `DryEffects` with `dry`."""
    return effects_port.choose(
        dry,
        engine=engine,
        tenant=settings.tenant,
        metrics=metrics,
        remember_s=settings.event_retention_days * 86_400,
    )
