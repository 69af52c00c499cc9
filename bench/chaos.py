"""Chaos soak: agents SIGKILLed at random and the conductor restarted while issues flow.

    .venv/bin/python bench/chaos.py [--issues 1000] [--agents 6] [--kill-every 2.0]
        [--conductor-restarts 2] [--poison 5] [--quick] [--timeout 600]

Starts `rig-conductor serve` and N `rig-conductor agent` processes in one consumer group and
dispatches the issues through `POST /api/events`. The agents' handler (`handle` below) sleeps a
few ms and writes one staged file per issue and attempt; the poison issues' handler always
raises. Every --kill-every seconds a random agent is SIGKILLed and replaced by a new process with
a new CONSUMER_ID (a new pod), so whatever the dead one held must be reclaimed. The conductor
itself is restarted --conductor-restarts times at evenly spaced points of the progress, stopped
with SIGKILL and SIGTERM alternately (--conductor-signal). --rate paces the dispatch (25 issues/s;
0 = as fast as possible), so the kills and restarts land while work is in flight; --work-ms is
the handler's sleep (5).

Counts printed on stdout, one `name: value` per line:
- dispatched: issues whose ISSUE_ASSIGNED was answered (retried through conductor restarts);
- completed: issues with an accepted (not fenced) WORK_COMPLETED;
- dead-lettered: issues in `<stream>:dlq`; poison ones are expected there, no other;
- lost: dispatched, neither completed nor dead-lettered, and neither pending nor undelivered;
- unfinished: dispatched, neither completed nor dead-lettered (still in play at the end);
- pending entries left: entries still in the group's pending list at the end, each listed with
  its owner and whether its issue is done;
- double-committed effects: issues with more than one committed file, or accepted completions
  of more than one attempt (the file name carries entry id and attempt, so two committed
  attempts show up as two files), or a committed file of an attempt that was not accepted;
- missing effects: completed non-poison issues without a committed file;
- fenced reports: WORK_* reports the conductor refused as coming from an outdated attempt;
- reclaims: `[StreamReclaim] Reclaimed` lines in the conductor logs.
The run stops once every dispatched issue is completed or dead-lettered (then it waits up to
15 s for the pending list to empty), at --timeout, or after 60 s without any issue settling.
Exit 1 when anything is lost, double-committed or missing, a non-poison issue was dead-lettered,
or issues were left unfinished; else 0.

Servers: RIG_BENCH_REDIS_URL / RIG_BENCH_DATABASE_URL when set (nothing is flushed: the run uses
its own stream `chaos:<run>` and tenant `chaos-<run>`, and deletes its Redis keys at the end),
else an embedded Redis 6.2 and PostgreSQL 16 in a temporary directory. Logs and effect files go
to a temporary directory, kept (and named) when the run fails or with --keep.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.engine import make_url

from rig_conductor.adapters import redis_streams

logger = logging.getLogger("chaos")

BENCH_DIR = Path(__file__).resolve().parent
GROUP = "chaos"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 40.0  # serve drains for up to 30 s, an agent finishes its entry for up to 30 s
CONDUCTOR_DOWNTIME_S = 1.0
PROGRESS_EVERY_S = 5.0
STALL_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 15.0
DEGRADED_GRACE_MS = 1_000
ENTRY_DEADLINE_MS = 2_000
RECLAIMED = re.compile(r"\[StreamReclaim\] Reclaimed (\S+) on (\S+): ")
REAPER_DEAD_LETTERED = re.compile(r"\[StreamReclaim\] Dead-lettered (\S+) on (\S+) after ")


# The handler, run by the agent processes (`--handler chaos:handle`, bench/ on PYTHONPATH).


def handle(entry: Any) -> None:
    """Sleep CHAOS_WORK_MS, then stage `<issueId>--<entryId>.a<attempt>.json`; poison raises.

    With CHAOS_DEGRADED set, every call raises Degraded (a provider out of quota); with
    CHAOS_HANG_EVERY=n, the first attempt of every n-th issue hangs for CHAOS_HANG_S without
    progress (a deadlocked CLI), past RIG_ENTRY_DEADLINE_MS.
    """
    from rig_conductor.agent import Degraded

    issue = entry.fields["issueId"]
    if os.environ.get("CHAOS_DEGRADED"):
        pause = timedelta(seconds=float(os.environ.get("CHAOS_DEGRADED_PAUSE_S", "2")))
        raise Degraded("chaos_quota_exhausted", until=datetime.now(UTC) + pause)
    if json.loads(entry.fields.get("payload") or "{}").get("poison"):
        raise RuntimeError(f"{issue} is poison: its build fails every time")
    hang_every = int(os.environ.get("CHAOS_HANG_EVERY", "0"))
    if hang_every and entry.attempt == 1 and int(issue.rsplit("-", 1)[1]) % hang_every == 0:
        time.sleep(float(os.environ.get("CHAOS_HANG_S", "20")))
    time.sleep(float(os.environ.get("CHAOS_WORK_MS", "5")) / 1000)
    effect = {
        "issueId": issue,
        "entryId": entry.id,
        "consumer": entry.consumer,
        "attempt": entry.attempt,
    }
    final = Path(os.environ["CHAOS_OUT_DIR"]) / f"{issue}--{entry.id}.a{entry.attempt}.json"
    entry.stage(final).write_text(json.dumps(effect))


# The soak.


@dataclass(frozen=True)
class Options:
    issues: int
    agents: int
    kill_every: float
    conductor_restarts: int
    poison: int
    timeout: float
    work_ms: float
    rate: float
    max_deliveries: int
    seed: int | None
    keep: bool
    conductor_signal: str  # kill, term or alternate (kill first)
    degraded_agents: int  # agents whose every call raises Degraded; never killed
    hang_every: int  # the first attempt of every n-th issue hangs (0: none)


@dataclass
class Child:
    """One process of the run, logging to its own file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        """Send `sig` and wait; SIGKILL when it takes longer than STOP_TIMEOUT_S."""
        self.send(sig)
        try:
            return await asyncio.to_thread(self.process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs: SIGKILL", self.name, STOP_TIMEOUT_S)
            self.send(signal.SIGKILL)
            return await asyncio.to_thread(self.process.wait)


@dataclass
class Tally:
    """What the run did to the system, counted as it went."""

    agent_kills: int = 0
    agent_crashes: int = 0  # agents that exited without being killed
    conductor_restarts: int = 0
    dispatch_retries: int = 0
    dispatch_failures: int = 0


@dataclass(frozen=True)
class Held:
    """A pending entry: its issue, owner and delivery count."""

    issue: str
    consumer: str
    deliveries: int


@dataclass
class Snapshot:
    completed: dict[str, set[tuple[str, int]]]  # issue -> accepted (entry id, attempt)
    dead_lettered: dict[str, str]  # issue -> dlq reason
    pending: dict[str, Held]  # entry id -> who holds it
    undelivered: set[str]  # issues with an entry the group has not delivered yet

    @property
    def done(self) -> set[str]:
        return set(self.completed) | set(self.dead_lettered)

    def unsettled(self) -> set[str]:
        """Issues still in play: pending or not delivered yet."""
        return {held.issue for held in self.pending.values()} | self.undelivered

    def drained(self) -> bool:
        return not self.pending and not self.undelivered


@dataclass
class Soak:
    options: Options
    redis_url: str
    database_url: str
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    tally: Tally = field(default_factory=Tally)
    entries: dict[str, str] = field(default_factory=dict)  # issue -> entry id
    agents: list[Child] = field(default_factory=list)
    conductors: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stream = f"chaos:{self.run_id}"
        self.tenant = f"chaos-{self.run_id}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"rig-chaos-{self.run_id}-"))
        self.out = self.workdir / "effects"
        self.logs = self.workdir / "logs"
        self.out.mkdir()
        self.logs.mkdir()
        self.rng = random.Random(self.options.seed)
        self.issues = [f"chaos-{self.run_id}-{n:05d}" for n in range(self.options.issues)]
        self.poison = set(self.rng.sample(self.issues, min(self.options.poison, len(self.issues))))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_ids = [f"chaos-w{slot}" for slot in range(self.options.agents)]
        self.degraded_ids = [f"chaos-degraded{n}" for n in range(self.options.degraded_agents)]
        self.slots: list[Child] = []
        self.incarnations = [0] * self.options.agents
        self.latest: Snapshot | None = None
        self.dispatched = asyncio.Event()

    # Processes.

    def _environment(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        env.update(RIG_REDIS_URL=self.redis_url, RIG_DISPATCH_STREAM=self.stream, **extra)
        return env

    def _spawn(self, name: str, command: list[str], env: dict[str, str]) -> Child:
        log = self.logs / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "rig_conductor", *command],
                cwd=self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the soak, which stops them in order
            )
        return Child(name, process, log)

    def _conductor_env(self) -> dict[str, str]:
        return self._environment(
            RIG_DATABASE_URL=self.database_url,
            RIG_HTTP_HOST="127.0.0.1",
            RIG_HTTP_PORT=str(self.port),
            RIG_STREAMS=self.stream,
            RIG_AGENT_IDS=",".join(self.agent_ids + self.degraded_ids),
            RIG_ENTRY_STALE_MS="1000",
            RIG_AGENT_DOWN_MS="3000",
            RIG_SCAN_INTERVAL_S="0.5",
            # Longer than a heartbeat interval: a restarted conductor hears from the live agents
            # before it judges anyone by heartbeats that stopped only because it was away.
            RIG_STARTUP_DELAY_S="1",
            RIG_MAX_DELIVERIES=str(self.options.max_deliveries),
            RIG_DEGRADED_GRACE_MS=str(DEGRADED_GRACE_MS),
            RIG_ENTRY_DEADLINE_MS=str(ENTRY_DEADLINE_MS),
            RIG_TENANT=self.tenant,
            RIG_K8S_ENABLED="false",
        )

    async def migrate(self) -> None:
        child = self._spawn("migrate", ["migrate"], self._conductor_env())
        code = await asyncio.to_thread(child.process.wait, READY_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"rig-conductor migrate failed: {child.log.read_text()[-2000:]}")

    async def start_conductor(self) -> None:
        name = f"conductor-{len(self.conductors) + 1}"
        child = self._spawn(name, ["serve"], self._conductor_env())
        self.conductors.append(child)
        deadline = time.monotonic() + READY_TIMEOUT_S
        async with httpx.AsyncClient(base_url=self.url, timeout=2) as client:
            while time.monotonic() < deadline:
                if not child.alive():
                    raise RuntimeError(f"{name} exited: {child.log.read_text()[-2000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{name} not ready within {READY_TIMEOUT_S:.0f}s")

    def start_agent(self, slot: int) -> Child:
        self.incarnations[slot] += 1
        agent_id = self.agent_ids[slot]
        consumer = f"{agent_id}-{self.incarnations[slot]}"  # a new pod, a new consumer name
        return self._agent(agent_id, consumer, CHAOS_HANG_EVERY=str(self.options.hang_every))

    def start_degraded_agent(self, agent_id: str) -> Child:
        return self._agent(agent_id, f"{agent_id}-0", CHAOS_DEGRADED="1")

    def _agent(self, agent_id: str, consumer: str, **extra: str) -> Child:
        python_path = [p for p in (os.environ.get("PYTHONPATH"), str(BENCH_DIR)) if p]
        env = self._environment(
            RIG_CONDUCTOR_URL=self.url,
            RIG_HEARTBEAT_INTERVAL_S="0.5",
            RIG_SCAN_INTERVAL_S="1",
            RIG_MAX_DELIVERIES=str(self.options.max_deliveries),
            CONSUMER_ID=consumer,
            PYTHONPATH=os.pathsep.join(python_path),
            CHAOS_OUT_DIR=str(self.out),
            CHAOS_WORK_MS=str(self.options.work_ms),
            RIG_ENTRY_DEADLINE_MS=str(ENTRY_DEADLINE_MS),
            **extra,
        )
        command = ["agent", "--agent-id", agent_id, "--group", GROUP, "--stream", self.stream]
        child = self._spawn(consumer, [*command, "--handler", "chaos:handle"], env)
        self.agents.append(child)
        return child

    async def stop_everything(self) -> None:
        await asyncio.gather(*(agent.stop() for agent in self.agents if agent.alive()))
        await asyncio.gather(*(c.stop() for c in self.conductors if c.alive()))

    # Chaos.

    async def kill_agents(self) -> None:
        """Every --kill-every seconds: SIGKILL a random agent, start its replacement."""
        while True:
            await asyncio.sleep(self.options.kill_every)
            slot = self.rng.randrange(len(self.slots))
            victim = self.slots[slot]
            await victim.stop(signal.SIGKILL)
            self.tally.agent_kills += 1
            self.slots[slot] = self.start_agent(slot)
            logger.info("SIGKILLed %s, started %s", victim.name, self.slots[slot].name)

    async def restart_conductor(self) -> None:
        """Restart the conductor at evenly spaced points of the progress."""
        restarts = self.options.conductor_restarts
        for n in range(1, restarts + 1):
            while self._progress() < n / (restarts + 1):  # noqa: ASYNC110 - a cheap poll
                await asyncio.sleep(0.2)
            sig = self._conductor_signal(n)
            current = self.conductors[-1]
            code = await current.stop(sig)
            logger.info("Conductor stopped with %s (exit %s); restarting", sig.name, code)
            await asyncio.sleep(CONDUCTOR_DOWNTIME_S)
            await self.start_conductor()
            self.tally.conductor_restarts += 1
            logger.info("Conductor %s ready", self.conductors[-1].name)

    def _conductor_signal(self, n: int) -> signal.Signals:
        how = self.options.conductor_signal
        if how == "kill" or (how == "alternate" and n % 2):
            return signal.SIGKILL
        return signal.SIGTERM

    async def watch_agents(self) -> None:
        """An agent that exits on its own is a crash: count it and start a replacement."""
        while True:
            await asyncio.sleep(0.5)
            for slot, child in enumerate(self.slots):
                if not child.alive():
                    self.tally.agent_crashes += 1
                    logger.warning("%s exited by itself (%s)", child.name, child.process.returncode)
                    self.slots[slot] = self.start_agent(slot)

    def _progress(self) -> float:
        snapshot = self.latest
        if snapshot is None:
            return 0.0
        done = len(set(snapshot.completed) | set(snapshot.dead_lettered))
        return done / max(1, len(self.issues))

    # Dispatch.

    async def dispatch_all(self, api: httpx.AsyncClient) -> None:
        gate = asyncio.Semaphore(16)
        started = time.monotonic()
        rate = self.options.rate

        async def one(n: int, issue: str) -> None:
            if rate > 0:
                await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            async with gate:
                self.entries[issue] = await self._dispatch(api, issue)

        results = await asyncio.gather(
            *(one(n, issue) for n, issue in enumerate(self.issues)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, Exception):
                self.tally.dispatch_failures += 1
                logger.error("Dispatch failed: %s", result)
        self.dispatched.set()

    async def _dispatch(self, api: httpx.AsyncClient, issue: str) -> str:
        """ISSUE_ASSIGNED, retried through conductor restarts; the issue id is the idempotency
        key, so a retry of a dispatch that did go through appends nothing."""
        body = {
            "type": "ISSUE_ASSIGNED",
            "issueId": issue,
            "agentId": "chaos",
            "payload": {"title": f"Build {issue}", "poison": issue in self.poison},
        }
        while True:
            try:
                answer = await api.post("/api/events", json=body)
            except httpx.TransportError:
                pass
            else:
                if answer.status_code in (200, 201):
                    entry_id: str = answer.json()["entryId"]
                    return entry_id
                if answer.status_code < 500:
                    raise RuntimeError(f"{issue}: {answer.status_code} {answer.text[:200]}")
            self.tally.dispatch_retries += 1
            await asyncio.sleep(0.2 + self.rng.random() * 0.3)

    # Observation.

    async def snapshot(self, redis: Redis, db: psycopg.AsyncConnection[Any]) -> Snapshot:
        completed: dict[str, set[tuple[str, int]]] = defaultdict(set)
        rows = await db.execute(
            "SELECT issue_id, entry_id, attempt FROM events WHERE tenant = %s AND stream = %s "
            "AND kind = 'WORK_COMPLETED' AND NOT fenced",
            (self.tenant, self.stream),
        )
        for issue, entry_id, attempt in await rows.fetchall():
            completed[issue].add((entry_id, attempt))
        letters = {
            fields.get("issueId", fields["originalId"]): fields.get("reason", "")
            for _, fields in await redis.xrange(f"{self.stream}:dlq")
        }
        pending = await _pending_entries(redis, self.stream)
        return Snapshot(dict(completed), letters, pending, await _undelivered(redis, self.stream))

    async def monitor(self, redis: Redis, db: psycopg.AsyncConnection[Any]) -> bool:
        """Until every dispatched issue is completed or dead-lettered (True), or --timeout or
        STALL_TIMEOUT_S without any issue settling (False); the progress every few seconds."""
        started = time.monotonic()
        deadline = started + self.options.timeout
        next_report = started + PROGRESS_EVERY_S
        settled, last_change = 0, started
        while (now := time.monotonic()) < deadline:
            snapshot = self.latest = await self.snapshot(redis, db)
            if self.dispatched.is_set() and set(self.entries) <= snapshot.done:
                await self._drain(redis, db, min(deadline, now + DRAIN_TIMEOUT_S))
                return True
            if len(snapshot.done) != settled:
                settled, last_change = len(snapshot.done), now
            elif now - last_change > STALL_TIMEOUT_S:
                logger.error("No issue settled for %.0fs: stopping", STALL_TIMEOUT_S)
                return False
            if now >= next_report:
                next_report += PROGRESS_EVERY_S
                self._log_progress(now - started)
            await asyncio.sleep(0.5)
        return False

    async def _drain(self, redis: Redis, db: psycopg.AsyncConnection[Any], until: float) -> None:
        """Every issue is settled; an entry completed by an agent killed before its XACK stays
        pending until reclaimed (its next owner finds it done and acks it): give that time."""
        while time.monotonic() < until:
            self.latest = await self.snapshot(redis, db)
            if self.latest.drained():
                return
            await asyncio.sleep(0.5)
        logger.warning("Every issue is settled, but entries are still pending")

    def _log_progress(self, elapsed: float) -> None:
        latest = self.latest
        assert latest is not None
        logger.info(
            "%5.1fs: dispatched %d/%d, completed %d, dead-lettered %d, pending %d, "
            "agent kills %d, conductor restarts %d",
            elapsed,
            len(self.entries),
            len(self.issues),
            len(latest.completed),
            len(latest.dead_lettered),
            len(latest.unsettled()),
            self.tally.agent_kills,
            self.tally.conductor_restarts,
        )

    # The run.

    async def run(self) -> int:
        started = time.monotonic()
        redis = redis_streams.connect(self.redis_url)
        conninfo = _conninfo(self.database_url)
        try:
            await self.migrate()
            await self.start_conductor()
            self.slots = [self.start_agent(slot) for slot in range(self.options.agents)]
            for agent_id in self.degraded_ids:
                self.start_degraded_agent(agent_id)
            async with (
                await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as db,
                httpx.AsyncClient(base_url=self.url, timeout=30) as api,
            ):
                settled = await self._chaos(api, redis, db)
                await self.stop_everything()
                report = await self.report(redis, db, settled, time.monotonic() - started)
        finally:
            await self.stop_everything()
            if not self.options.keep:
                await _forget(redis, self.stream)
            await redis.aclose()
        failed = report.print()
        if failed or self.options.keep:
            print(f"logs and effects: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return 1 if failed else 0

    async def _chaos(
        self, api: httpx.AsyncClient, redis: Redis, db: psycopg.AsyncConnection[Any]
    ) -> bool:
        tasks = [
            asyncio.create_task(self.dispatch_all(api)),
            asyncio.create_task(self.kill_agents()),
            asyncio.create_task(self.restart_conductor()),
            asyncio.create_task(self.watch_agents()),
        ]
        try:
            settled = await self.monitor(redis, db)
        finally:
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                raise outcome
        return settled

    async def report(
        self, redis: Redis, db: psycopg.AsyncConnection[Any], settled: bool, elapsed: float
    ) -> Report:
        final = await self.snapshot(redis, db)
        stream_issues: dict[str, int] = defaultdict(int)
        for _, fields in await redis.xrange(self.stream):
            stream_issues[fields.get("issueId", "")] += 1
        rows = await db.execute(
            "SELECT count(*) FROM events WHERE tenant = %s AND stream = %s AND fenced",
            (self.tenant, self.stream),
        )
        fenced_row = await rows.fetchone()
        rows = await db.execute(
            "SELECT detail->>'reason', sum(cardinality(entry_ids)) FROM events "
            "WHERE tenant = %s AND stream = %s AND kind = 'RECLAIMED' GROUP BY 1 ORDER BY 1",
            (self.tenant, self.stream),
        )
        by_reason = {str(reason): int(n) for reason, n in await rows.fetchall()}
        return Report(
            soak=self,
            final=final,
            settled=settled,
            elapsed=elapsed,
            effects=_effects(self.out),
            leftovers=len(list(self.out.glob(".*.tmp"))),
            duplicated=sorted(issue for issue, n in stream_issues.items() if n > 1),
            fenced=int(fenced_row[0]) if fenced_row else 0,
            reclaimed_by_reason=by_reason,
            logs=[c.log.read_text(errors="replace") for c in self.conductors],
        )


@dataclass
class Report:
    soak: Soak
    final: Snapshot
    settled: bool
    elapsed: float
    effects: dict[str, list[tuple[str, int]]]  # issue -> committed (entry id, attempt)
    leftovers: int
    duplicated: list[str]  # issues with more than one stream entry
    fenced: int
    reclaimed_by_reason: dict[str, int]
    logs: list[str]

    def print(self) -> bool:
        """Print the counts; True when the run failed."""
        soak, final = self.soak, self.final
        opts = soak.options
        dispatched = set(soak.entries)
        completed, letters = set(final.completed), set(final.dead_lettered)
        lost = dispatched - completed - letters - final.unsettled()
        double = self._double_committed()
        missing = {
            i for i in completed - soak.poison if not self.effects.get(i) and i not in double
        }
        other_letters = letters - soak.poison
        reclaims = sum(
            1 for log in self.logs for _, s in RECLAIMED.findall(log) if s == soak.stream
        )
        by_reaper = sum(
            1 for log in self.logs for _, s in REAPER_DEAD_LETTERED.findall(log) if s == soak.stream
        )
        lines = [
            f"rig-conductor chaos soak {soak.run_id}: {opts.issues} issues ({len(soak.poison)} "
            f"poison), {opts.agents} agents, an agent SIGKILLed every {opts.kill_every:g}s, "
            f"{opts.conductor_restarts} conductor restarts, {opts.degraded_agents} always-degraded "
            f"agents, the first attempt of every {opts.hang_every}th issue hung",
            f"dispatched: {len(dispatched)}",
            f"completed: {len(completed)}",
            f"dead-lettered: {len(letters)} (poison {len(letters & soak.poison)} of "
            f"{len(soak.poison)}, other {len(other_letters)}; by the reaper {by_reaper})",
            f"lost: {len(lost)}",
            f"unfinished: {len(dispatched - completed - letters)}",
            f"pending entries left: {len(final.pending)} (undelivered: {len(final.undelivered)})",
            f"double-committed effects: {len(double)}",
            f"missing effects: {len(missing)}",
            f"fenced reports: {self.fenced}",
            f"reclaims: {reclaims}",
            "reclaims by reason: "
            + (", ".join(f"{r} {n}" for r, n in self.reclaimed_by_reason.items()) or "none"),
            f"issues dispatched twice: {len(self.duplicated)}",
            f"orphaned staged files: {self.leftovers}",
            f"agent kills: {soak.tally.agent_kills}",
            f"agent crashes: {soak.tally.agent_crashes}",
            f"conductor restarts: {soak.tally.conductor_restarts}",
            f"dispatch retries: {soak.tally.dispatch_retries}",
            f"duration: {self.elapsed:.1f}s",
        ]
        problems = {
            "lost": sorted(lost),
            "double-committed": sorted(double),
            "missing effects": sorted(missing),
            "non-poison dead-lettered": sorted(other_letters),
            "not dispatched": sorted(set(soak.issues) - dispatched),
            "dispatched twice (more than one stream entry)": self.duplicated,
        }
        failed = any(problems.values()) or not self.settled
        lines += self._pending_lines()
        for name, issues in problems.items():
            if issues:
                lines.append(
                    f"{name}: {', '.join(issues[:20])}{' ...' if len(issues) > 20 else ''}"
                )
        if not self.settled:
            lines.append(f"did not settle within {opts.timeout:g}s")
        lines.append(f"result: {'FAIL' if failed else 'PASS'}")
        print("\n".join(lines), flush=True)
        return failed

    def _pending_lines(self) -> list[str]:
        """What still sits in the pending list, and whether its issue is done."""
        final = self.final
        lines = []
        for entry_id, held in sorted(final.pending.items())[:10]:
            state = (
                "completed"
                if held.issue in final.completed
                else "dead-lettered"
                if held.issue in final.dead_lettered
                else "not done"
            )
            lines.append(
                f"pending {entry_id}: issue {held.issue} ({state}), held by {held.consumer} "
                f"after {held.deliveries} deliveries"
            )
        return lines

    def _double_committed(self) -> set[str]:
        """More than one committed file, accepted completions of more than one attempt, or a
        committed file of an attempt the conductor did not accept."""
        double = set()
        for issue in set(self.final.completed) | set(self.effects):
            accepted = self.final.completed.get(issue, set())
            files = self.effects.get(issue, [])
            if len(files) > 1 or len(accepted) > 1 or any(f not in accepted for f in files):
                double.add(issue)
        return double


async def _pending_entries(redis: Redis, stream: str) -> dict[str, Held]:
    try:
        rows = await redis.xpending_range(stream, GROUP, min="-", max="+", count=1_000_000)
    except ResponseError:  # NOGROUP: no agent has joined yet
        return {}
    held: dict[str, Held] = {}
    for row in rows:
        entry_id = row["message_id"]
        found = await redis.xrange(stream, min=entry_id, max=entry_id)
        issue = found[0][1].get("issueId", entry_id) if found else entry_id
        held[entry_id] = Held(issue, row["consumer"], int(row["times_delivered"]))
    return held


async def _undelivered(redis: Redis, stream: str) -> set[str]:
    """Issues of the entries appended after the group's last delivered id."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:  # no stream yet
        return set()
    last = next((g["last-delivered-id"] for g in groups if g["name"] == GROUP), "0-0")
    entries = await redis.xrange(stream, min=f"({last}", max="+")
    return {fields.get("issueId", entry_id) for entry_id, fields in entries}


async def _forget(redis: Redis, stream: str) -> None:
    """The run's Redis keys: the stream, its DLQ, staged-commit intents, consumer leases."""
    keys = [stream, f"{stream}:dlq"]
    for pattern in (f"rig:staged:{stream}:*", f"rig:consumer:{stream}:*"):
        keys += [key async for key in redis.scan_iter(match=pattern, count=1000)]
    with contextlib.suppress(Exception):
        await redis.delete(*keys)


def _effects(directory: Path) -> dict[str, list[tuple[str, int]]]:
    """Committed effect files: issue -> [(entry id, attempt)]."""
    found: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in directory.glob("*.json"):
        effect = json.loads(path.read_text())
        found[effect["issueId"]].append((effect["entryId"], int(effect["attempt"])))
    return dict(found)


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def servers() -> Iterator[tuple[str, str]]:
    """RIG_BENCH_REDIS_URL / RIG_BENCH_DATABASE_URL, else embedded servers."""
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL")
    database_url = os.environ.get("RIG_BENCH_DATABASE_URL")
    if redis_url and database_url:
        yield redis_url, database_url
        return
    from rig_conductor.embedded import embedded_services

    with embedded_services() as services:
        yield redis_url or services.redis_url, database_url or services.database_url


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--issues", type=int, help="issues to dispatch (1000; quick 100)")
    parser.add_argument("--agents", type=int, help="agent processes (6; quick 3)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--conductor-restarts", type=int, help="conductor restarts (2; quick 1)")
    parser.add_argument("--poison", type=int, help="issues whose handler always fails (5; quick 2)")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds (600; 120)")
    parser.add_argument("--work-ms", type=float, default=5.0, help="handler sleep per issue")
    parser.add_argument(
        "--rate", type=float, help="dispatches per second, 0 = as fast as possible (25; quick 8)"
    )
    parser.add_argument("--max-deliveries", type=int, default=5, help="RIG_MAX_DELIVERIES")
    parser.add_argument("--seed", type=int, help="random seed (kills, poison issues)")
    parser.add_argument("--keep", action="store_true", help="keep logs, effects and Redis keys")
    parser.add_argument(
        "--conductor-signal",
        choices=("alternate", "kill", "term"),
        default="alternate",
        help="how the conductor is stopped for a restart (alternate: SIGKILL, SIGTERM, ...)",
    )
    parser.add_argument(
        "--degraded-agents", type=int, default=1, help="agents that are always degraded (1)"
    )
    parser.add_argument(
        "--hang-every", type=int, help="the first attempt of every n-th issue hangs (50; 20)"
    )
    parser.add_argument("--quick", action="store_true", help="CI run: 100 issues, 3 agents")
    args = parser.parse_args(argv)
    quick = args.quick

    def pick(value: Any, full: Any, small: Any) -> Any:
        return value if value is not None else (small if quick else full)

    return Options(
        issues=pick(args.issues, 1000, 100),
        agents=pick(args.agents, 6, 3),
        kill_every=args.kill_every,
        conductor_restarts=pick(args.conductor_restarts, 2, 1),
        poison=pick(args.poison, 5, 2),
        timeout=pick(args.timeout, 600.0, 120.0),
        work_ms=args.work_ms,
        rate=pick(args.rate, 25.0, 8.0),
        max_deliveries=args.max_deliveries,
        seed=args.seed,
        keep=args.keep,
        conductor_signal=args.conductor_signal,
        degraded_agents=args.degraded_agents,
        hang_every=pick(args.hang_every, 50, 20),
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv)
    if options.agents < 2 or options.issues < 1 or options.kill_every <= 0:
        print("chaos: needs --agents >= 2, --issues >= 1, --kill-every > 0", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)-7s %(message)s"
    )
    logger.setLevel(logging.INFO)
    try:
        with servers() as (redis_url, database_url):
            return asyncio.run(Soak(options, redis_url, database_url).run())
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
