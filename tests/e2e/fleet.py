"""Real `rig-conductor agent` processes for the end-to-end tests, and the state they check.

Every process logs to a file (a pipe nobody reads would fill up and stall it) and is reaped
when the fleet closes: SIGTERM, then SIGKILL for one that does not stop in time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import httpx
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events
from rig_conductor.agent.runtime import SHUTDOWN_GRACE_S
from tests.audit_conftest import JDBC_JAR, require_pyspark, unavailable

REPO = Path(__file__).resolve().parents[2]
STREAM = "rig:dispatch"
DLQ = f"{STREAM}:dlq"
GROUP = "builders"
HANDLER = "tests.e2e.handlers:build"
# The runtime may take SHUTDOWN_GRACE_S to finish its current entry after SIGTERM (contract:
# finish or abandon it, then exit); a test that killed it sooner would see -9 from a loaded
# machine's slow but correct shutdown.
STOP_TIMEOUT_S = SHUTDOWN_GRACE_S + 15
# The Spark audit a test runs at its end (`run_audit`) may take minutes on a loaded machine;
# past AUDIT_S it fails with its own stderr. A test that runs it is bounded by AUDITED_TEST_S,
# so that bound, not the test's, is the one that speaks.
AUDIT_S = 600
AUDITED_TEST_S = AUDIT_S + 600


# For an agent that must take its next entry from the stream, not its own pending list: a
# failed entry stays pending, and a loaded machine can make the runtime's next read of its own
# list (every RIG_SCAN_INTERVAL_S) come first. Its list is read at start only.
ONE_READ = {"RIG_SCAN_INTERVAL_S": "3600"}


def conductor_env(agent_ids: list[str], **extra: str) -> dict[str, str]:
    """`rig-conductor serve` settings on short thresholds: a dead agent is noticed in seconds."""
    return {
        "RIG_STREAMS": STREAM,
        "RIG_DISPATCH_STREAM": STREAM,
        "RIG_AGENT_IDS": ",".join(agent_ids),
        "RIG_ENTRY_STALE_MS": "1000",
        "RIG_AGENT_DOWN_MS": "3000",
        "RIG_SCAN_INTERVAL_S": "0.5",
        "RIG_STARTUP_DELAY_S": "0",
        "RIG_K8S_ENABLED": "false",
        "RIG_ALLOW_ANONYMOUS": "true",
        **extra,
    }


@dataclass
class AgentProcess:
    agent_id: str
    consumer: str
    process: subprocess.Popen[bytes]
    log: Path
    terminated: bool = False

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no handler finishes, nothing is acked, heartbeats stop."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def terminate(self) -> None:
        """SIGTERM, once: a second one tells the runtime to abandon its entry."""
        if not self.terminated and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.terminated = True

    def stop(self) -> int:
        """SIGTERM and wait. One that does not exit in time writes where it is stuck into its
        log (its asyncio tasks on SIGUSR1, `tests.e2e.handlers`; its threads on SIGABRT,
        faulthandler), then is killed. Returns the exit code."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.send_signal(signal.SIGUSR1)
                time.sleep(1)  # time to log its tasks before SIGABRT ends it
                self.process.send_signal(signal.SIGABRT)
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        return self.process.returncode


def spawn(
    agent_id: str,
    consumer: str,
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
) -> AgentProcess:
    """An agent process of any runtime, its output (both streams) in the file `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )
    return AgentProcess(agent_id, consumer, process, log)


@dataclass
class Fleet:
    """Agents of one group; `with Fleet(...) as fleet:` reaps them all on exit."""

    redis_url: str
    conductor_url: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    agents: list[AgentProcess] = field(default_factory=list)

    def start(
        self,
        agent_id: str,
        consumer: str,
        *,
        stream: str = STREAM,
        group: str = GROUP,
        handler: str = HANDLER,
        **env: str,
    ) -> AgentProcess:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        python_path = [p for p in (environment.get("PYTHONPATH"), str(REPO)) if p]
        environment.update(
            {
                "PYTHONPATH": os.pathsep.join(python_path),
                "PYTHONFAULTHANDLER": "1",  # threads' stacks into the log on SIGABRT (`stop`)
                "RIG_REDIS_URL": self.redis_url,
                "RIG_CONDUCTOR_URL": self.conductor_url,
                "RIG_HEARTBEAT_INTERVAL_S": "0.5",
                "RIG_SCAN_INTERVAL_S": "1",
                "CONSUMER_ID": consumer,
            }
            | self.env
            | env
        )
        command = [sys.executable, "-m", "rig_conductor", "agent", "--agent-id", agent_id]
        command += ["--group", group, "--stream", stream, "--handler", handler]
        log = self.workdir / "logs" / f"{consumer}.log"
        agent = spawn(agent_id, consumer, command, cwd=self.workdir, env=environment, log=log)
        self.agents.append(agent)
        return agent

    def stop_all(self) -> dict[str, int]:
        """SIGTERM to every agent at once, then each one's exit code."""
        for agent in self.agents:
            agent.terminate()
        return {agent.consumer: agent.stop() for agent in self.agents}

    def logs(self, codes: dict[str, int], expected: dict[str, int]) -> str:
        """The log tails of the agents whose exit code is not the expected one: the message of
        a failed assertion on `stop_all()`'s codes."""
        return self.tails(
            [a for a in self.agents if codes.get(a.consumer) != expected.get(a.consumer)],
            heading=lambda a: f"{a.consumer} exited {codes.get(a.consumer)}",
        )

    def tails(
        self,
        agents: list[AgentProcess] | None = None,
        *,
        heading: Callable[[AgentProcess], str] = lambda a: a.consumer,
        chars: int = 4000,
    ) -> str:
        """The log tails of `agents` (every agent by default): what a failed test says about
        the fleet."""
        chosen = self.agents if agents is None else agents
        return "\n".join(f"--- {heading(a)}:\n{a.output()[-chars:]}" for a in chosen)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop_all()


class Completion(NamedTuple):
    consumer: str
    attempt: int
    at: datetime


async def dispatch(api: httpx.AsyncClient, issue: str, payload: dict[str, Any]) -> str:
    answer = await api.post(
        "/api/events",
        json={"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "builder", "payload": payload},
    )
    assert answer.status_code == 201, answer.text
    entry_id: str = answer.json()["entryId"]
    return entry_id


async def heard_from(api: httpx.AsyncClient, consumer: str) -> bool:
    agents = (await api.get("/api/agents")).json()
    return any(consumer in agent["consumers"] for agent in agents)


async def pending(
    redis: Redis, consumer: str | None = None, *, stream: str = STREAM, group: str = GROUP
) -> dict[str, str]:
    """The group's (or one consumer's) pending list: entry id -> owner."""
    rows = await redis.xpending_range(
        stream, group, min="-", max="+", count=100_000, consumername=consumer
    )
    return {row["message_id"]: row["consumer"] for row in rows}


async def accepted_completions(
    engine: AsyncEngine, *, stream: str = STREAM
) -> dict[str, list[Completion]]:
    """entry id -> the WORK_COMPLETED reports the conductor accepted (not fenced)."""
    query = select(
        events.c.entry_id, events.c.consumer, events.c.attempt, events.c.occurred_at
    ).where(
        events.c.kind == "WORK_COMPLETED", events.c.stream == stream, events.c.fenced.is_(False)
    )
    found: dict[str, list[Completion]] = defaultdict(list)
    async with engine.connect() as conn:
        for row in await conn.execute(query.order_by(events.c.id)):
            found[row.entry_id].append(Completion(row.consumer, row.attempt, row.occurred_at))
    return dict(found)


async def work_events(engine: AsyncEngine, entry_id: str) -> list[tuple[str, int, bool]]:
    """(kind, attempt, fenced) of every WORK_* report about one entry, in order."""
    query = select(events.c.kind, events.c.attempt, events.c.fenced).where(
        events.c.stream == STREAM, events.c.entry_id == entry_id, events.c.kind.like("WORK_%")
    )
    async with engine.connect() as conn:
        rows = await conn.execute(query.order_by(events.c.id))
        return [(row.kind, row.attempt, row.fenced) for row in rows]


async def dead_letters(redis: Redis) -> dict[str, dict[str, str]]:
    """originalId -> the dead letter's fields, from `<stream>:dlq`."""
    return {fields["originalId"]: fields for _, fields in await redis.xrange(DLQ)}


def effects(out: Path) -> dict[str, dict[str, Any]]:
    """Committed effect files: issue id -> the file's content."""
    directory = out / "effects"
    if not directory.is_dir():
        return {}
    return {
        path.stem: json.loads(path.read_text())
        for path in directory.iterdir()
        if not path.name.startswith(".")
    }


def staged_leftovers(out: Path) -> list[str]:
    return sorted(str(path.relative_to(out)) for path in out.rglob(".*.tmp"))


def calls(out: Path, issue: str) -> list[str]:
    """Markers the handler left for each call on `issue`: `<issue>.<consumer>.a<attempt>`."""
    directory = out / "calls"
    return sorted(p.name for p in directory.glob(f"{issue}.*")) if directory.is_dir() else []


def run_audit(
    database_url: str, redis_url: str, out: Path, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """`rig-conductor audit` as a user runs it, over the whole event log; its summary.json.
    `env`: more RIG_* settings (a Redis topology's, for one).

    Off CI a machine without PySpark, Java or the JDBC jar skips; with CI set, that fails.
    """
    require_pyspark()
    if not JDBC_JAR.is_file():
        unavailable(f"no PostgreSQL JDBC driver at {JDBC_JAR} (Debian: libpostgresql-jdbc-java)")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(env or {}, RIG_DATABASE_URL=database_url, RIG_REDIS_URL=redis_url)
    command = [sys.executable, "-m", "rig_conductor", "audit", "--output", str(out)]
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=AUDIT_S, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary
