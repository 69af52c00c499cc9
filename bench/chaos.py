"""Chaos soak: agents SIGKILLed at random and the conductor restarted while issues flow. A soak
test rather than a benchmark: it checks that no work is lost or done twice.

    .venv/bin/python bench/chaos.py [--quick] [--issues 1000] [--agents 6] [--seed N] [--keep]
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
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Light imports only up here: the agent processes import this module for `handle`.
logger = logging.getLogger("chaos")
GROUP = "chaos"
BENCH_DIR = str(Path(__file__).resolve().parent)
STOP_TIMEOUT_S = 40.0  # serve drains for up to 30 s, an agent finishes its entry for up to 30 s
STALL_TIMEOUT_S, DRAIN_TIMEOUT_S, PROGRESS_EVERY_S = 60.0, 15.0, 5.0
ENTRY_DEADLINE_MS = "2000"
RECLAIMED = re.compile(r"\[StreamReclaim\] Reclaimed \S+ on (\S+): ")
DEAD_LETTERED = re.compile(r"\[StreamReclaim\] Dead-lettered \S+ on (\S+) after ")
TALLIES = ("agent kills", "agent crashes", "conductor restarts", "dispatch retries")


def handle(entry: Any) -> None:
    """Sleep 5 ms, then stage `<issueId>--<entryId>.a<attempt>.json`; poison raises. With
    CHAOS_DEGRADED every call raises Degraded (out of quota); with CHAOS_HANG_EVERY=n the first
    attempt of every n-th issue hangs for 20 s without progress (a deadlocked CLI)."""
    from rig_conductor.agent import Degraded

    issue = entry.fields["issueId"]
    if os.environ.get("CHAOS_DEGRADED"):
        # Its entries wait for the reaper's rule 3b. After a SIGKILLed conductor the next one
        # reaps only once the dead one's lease row has run out (up to 20 s): re-reading every
        # 6 s, an entry reaches RIG_MAX_DELIVERIES (5) after 25 s, not in the meantime.
        raise Degraded("chaos_quota_exhausted", until=datetime.now(UTC) + timedelta(seconds=6))
    if json.loads(entry.fields.get("payload") or "{}").get("poison"):
        raise RuntimeError(f"{issue} is poison: its build fails every time")
    hang_every = int(os.environ.get("CHAOS_HANG_EVERY", "0"))
    if hang_every and entry.attempt == 1 and int(issue.rsplit("-", 1)[1]) % hang_every == 0:
        time.sleep(20)
    time.sleep(0.005)
    effect = {"issueId": issue, "entryId": entry.id, "attempt": entry.attempt}
    final = Path(os.environ["CHAOS_OUT_DIR"]) / f"{issue}--{entry.id}.a{entry.attempt}.json"
    entry.stage(final).write_text(json.dumps(effect))


@dataclass
class Child:
    """One process of the run, logging to its own file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.process.send_signal(sig)  # nothing once it has exited
        try:
            return await asyncio.to_thread(self.process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs: SIGKILL", self.name, STOP_TIMEOUT_S)
            self.process.kill()
            return await asyncio.to_thread(self.process.wait)


@dataclass
class Snapshot:
    completed: dict[str, set[tuple[str, int]]]  # issue -> accepted (entry id, attempt)
    dead_lettered: set[str]  # issues
    pending: dict[str, tuple[str, str, int]]  # entry id -> (issue, holder, deliveries)
    undelivered: set[str]  # issues whose entry the group has not delivered yet

    @property
    def done(self) -> set[str]:
        return set(self.completed) | self.dead_lettered

    def unsettled(self) -> set[str]:
        return {issue for issue, _, _ in self.pending.values()} | self.undelivered


class Soak:
    def __init__(self, opts: argparse.Namespace, redis_url: str, database_url: str, port: int):
        self.opts, self.redis_url, self.database_url = opts, redis_url, database_url
        self.run_id = uuid.uuid4().hex[:8]
        self.stream, self.tenant = f"chaos:{self.run_id}", f"chaos-{self.run_id}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"rig-chaos-{self.run_id}-"))
        self.out, self.logs = self.workdir / "effects", self.workdir / "logs"
        self.out.mkdir()
        self.logs.mkdir()
        self.rng = random.Random(opts.seed)
        self.issues = [f"chaos-{self.run_id}-{n:05d}" for n in range(opts.issues)]
        self.poison = set(self.rng.sample(self.issues, min(opts.poison, len(self.issues))))
        self.url = f"http://127.0.0.1:{port}"
        self.agent_ids = [f"chaos-w{slot}" for slot in range(opts.agents)]
        self.agent_ids += [f"chaos-degraded{n}" for n in range(opts.degraded_agents)]
        self.entries: dict[str, str] = {}  # issue -> entry id
        self.children: list[Child] = []
        self.conductors: list[Child] = []
        self.slots: list[Child] = []
        self.incarnations = [0] * opts.agents
        self.tally: Counter[str] = Counter()
        self.latest: Snapshot | None = None
        self.dispatched = asyncio.Event()

    # Processes.
    def spawn(self, name: str, command: list[str], **env: str) -> Child:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        environment |= {"RIG_REDIS_URL": self.redis_url, "RIG_DISPATCH_STREAM": self.stream}
        log = self.logs / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "rig_conductor", *command],
                cwd=self.workdir,
                env=environment | env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the soak, which stops them in order
            )
        child = Child(name, process, log)
        self.children.append(child)
        return child

    async def start_conductor(self) -> None:
        import harness

        name = f"conductor-{len(self.conductors) + 1}"
        env = {"RIG_DATABASE_URL": self.database_url, "RIG_TENANT": self.tenant}
        env |= {"RIG_HTTP_HOST": "127.0.0.1", "RIG_HTTP_PORT": self.url.rsplit(":", 1)[1]}
        env |= {"RIG_STREAMS": self.stream, "RIG_AGENT_IDS": ",".join(self.agent_ids)}
        env |= {"RIG_ENTRY_STALE_MS": "1000", "RIG_AGENT_DOWN_MS": "3000"}
        # A start-up delay longer than a heartbeat interval: a restarted conductor hears from
        # the live agents before it judges anyone by heartbeats that stopped while it was away.
        env |= {"RIG_SCAN_INTERVAL_S": "0.5", "RIG_STARTUP_DELAY_S": "1"}
        env |= {"RIG_DEGRADED_GRACE_MS": "1000", "RIG_ENTRY_DEADLINE_MS": ENTRY_DEADLINE_MS}
        env |= {"RIG_K8S_ENABLED": "false", "RIG_ALLOW_ANONYMOUS": "true"}
        child = self.spawn(name, ["serve"], **env)
        self.conductors.append(child)
        try:
            await asyncio.to_thread(harness.wait_ready, child.process, f"{self.url}/readyz")
        except harness.BenchError as exc:
            raise RuntimeError(f"{exc}: {child.log.read_text()[-2000:]}") from None

    def start_agent(self, agent_id: str, consumer: str, **env: str) -> Child:
        python_path = [p for p in (os.environ.get("PYTHONPATH"), BENCH_DIR) if p]  # for handle
        env |= {"PYTHONPATH": os.pathsep.join(python_path), "CHAOS_OUT_DIR": str(self.out)}
        env |= {"RIG_CONDUCTOR_URL": self.url, "RIG_ENTRY_DEADLINE_MS": ENTRY_DEADLINE_MS}
        env |= {"RIG_HEARTBEAT_INTERVAL_S": "0.5", "RIG_SCAN_INTERVAL_S": "1"}
        command = ["agent", "--agent-id", agent_id, "--group", GROUP, "--stream", self.stream]
        command += ["--handler", "chaos:handle"]
        return self.spawn(consumer, command, CONSUMER_ID=consumer, **env)

    def start_worker(self, slot: int) -> Child:
        """The agent of `slot`, as a new pod: a new consumer name."""
        self.incarnations[slot] += 1
        agent_id = self.agent_ids[slot]
        consumer = f"{agent_id}-{self.incarnations[slot]}"
        return self.start_agent(agent_id, consumer, CHAOS_HANG_EVERY=str(self.opts.hang_every))

    async def stop_everything(self) -> None:
        agents = [c for c in self.children if c.alive() and c not in self.conductors]
        await asyncio.gather(*(agent.stop() for agent in agents))
        await asyncio.gather(*(c.stop() for c in self.conductors if c.alive()))

    # Chaos.
    async def kill_agents(self) -> None:
        while True:
            await asyncio.sleep(self.opts.kill_every)
            slot = self.rng.randrange(len(self.slots))
            victim = self.slots[slot]
            await victim.stop(signal.SIGKILL)
            self.tally["agent kills"] += 1
            self.slots[slot] = self.start_worker(slot)
            logger.info("SIGKILLed %s, started %s", victim.name, self.slots[slot].name)

    async def restart_conductor(self) -> None:
        restarts = self.opts.conductor_restarts
        for n in range(1, restarts + 1):
            share = n * len(self.issues) / (restarts + 1)
            while len(self.latest.done if self.latest else ()) < share:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
            sig = signal.SIGKILL if n % 2 else signal.SIGTERM
            code = await self.conductors[-1].stop(sig)
            logger.info("Conductor stopped with %s (exit %s); restarting", sig.name, code)
            await asyncio.sleep(1.0)
            await self.start_conductor()
            self.tally["conductor restarts"] += 1

    async def watch_agents(self) -> None:
        """An agent that exits on its own is a crash: count it and start a replacement."""
        while True:
            await asyncio.sleep(0.5)
            for slot, child in enumerate(self.slots):
                if not child.alive():
                    self.tally["agent crashes"] += 1
                    logger.warning("%s exited by itself (%s)", child.name, child.process.returncode)
                    self.slots[slot] = self.start_worker(slot)

    # Dispatch and observation.
    async def dispatch_all(self, api: Any) -> None:
        gate, started = asyncio.Semaphore(16), time.monotonic()

        async def one(n: int, issue: str) -> None:
            if self.opts.rate > 0:
                await asyncio.sleep(max(0.0, started + n / self.opts.rate - time.monotonic()))
            async with gate:
                self.entries[issue] = await self.dispatch(api, issue)

        jobs = (one(n, issue) for n, issue in enumerate(self.issues))
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, Exception):
                logger.error("Dispatch failed: %s", result)
        self.dispatched.set()

    async def dispatch(self, api: Any, issue: str) -> str:
        """ISSUE_ASSIGNED, retried through conductor restarts; the issue id is the idempotency
        key, so a retry of a dispatch that did go through appends nothing."""
        import httpx

        payload = {"title": f"Build {issue}", "poison": issue in self.poison}
        body = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "chaos", "payload": payload}
        while True:
            with contextlib.suppress(httpx.TransportError):
                answer = await api.post("/api/events", json=body)
                if answer.status_code in (200, 201):
                    return str(answer.json()["entryId"])
                if answer.status_code < 500:
                    raise RuntimeError(f"{issue}: {answer.status_code} {answer.text[:200]}")
            self.tally["dispatch retries"] += 1
            await asyncio.sleep(0.2 + self.rng.random() * 0.3)

    async def snapshot(self, redis: Any, db: Any) -> Snapshot:
        from redis.exceptions import ResponseError

        completed: dict[str, set[tuple[str, int]]] = defaultdict(set)
        rows = await db.execute(
            "SELECT issue_id, entry_id, attempt FROM events WHERE tenant = %s AND stream = %s "
            "AND kind = 'WORK_COMPLETED' AND NOT fenced",
            (self.tenant, self.stream),
        )
        for issue, entry_id, attempt in await rows.fetchall():
            completed[issue].add((entry_id, attempt))
        letters = await redis.xrange(f"{self.stream}:dlq")
        pending: dict[str, tuple[str, str, int]] = {}
        undelivered: set[str] = set()
        with contextlib.suppress(ResponseError):  # NOGROUP: no agent has joined yet
            for row in await redis.xpending_range(self.stream, GROUP, "-", "+", 1_000_000):
                found = await redis.xrange(self.stream, row["message_id"], row["message_id"])
                issue = found[0][1].get("issueId", "") if found else row["message_id"]
                pending[row["message_id"]] = (issue, row["consumer"], row["times_delivered"])
        with contextlib.suppress(ResponseError):  # no stream yet
            groups = await redis.xinfo_groups(self.stream)
            last = next((g["last-delivered-id"] for g in groups if g["name"] == GROUP), "0-0")
            undelivered = {f["issueId"] for _, f in await redis.xrange(self.stream, f"({last}")}
        letter_issues = {f.get("issueId", "") for _, f in letters}
        return Snapshot(dict(completed), letter_issues, pending, undelivered)

    async def monitor(self, redis: Any, db: Any) -> bool:
        """Until every dispatched issue is settled (True; then up to DRAIN_TIMEOUT_S more for
        the pending list to empty), or --timeout or STALL_TIMEOUT_S without progress (False)."""
        started = time.monotonic()
        deadline = started + self.opts.timeout
        settled, last_change, next_report = 0, started, started + PROGRESS_EVERY_S
        drain_until: float | None = None
        while (now := time.monotonic()) < deadline:
            latest = self.latest = await self.snapshot(redis, db)
            if self.dispatched.is_set() and set(self.entries) <= latest.done:
                # An entry completed by an agent killed before its XACK stays pending until
                # reclaimed (its next owner finds it done and acks it): give that time.
                drain_until = drain_until or min(deadline, now + DRAIN_TIMEOUT_S)
                if not latest.pending and not latest.undelivered:
                    return True
            if len(latest.done) != settled:
                settled, last_change = len(latest.done), now
            elif now - last_change > STALL_TIMEOUT_S:
                logger.error("No issue settled for %.0fs: stopping", STALL_TIMEOUT_S)
                return False
            if now >= next_report:
                next_report += PROGRESS_EVERY_S
                counts = (len(self.entries), len(latest.completed), len(latest.unsettled()))
                logger.info("%5.1fs: dispatched, completed, pending %s", now - started, counts)
            await asyncio.sleep(0.5)
            if drain_until is not None and time.monotonic() >= drain_until:
                logger.warning("Every issue is settled, but entries are still pending")
                return True
        return drain_until is not None

    # The run.
    async def run(self) -> int:
        import httpx
        import psycopg

        from harness import conninfo
        from rig_conductor.adapters import redis_streams

        started = time.monotonic()
        redis = redis_streams.connect(self.redis_url)
        try:
            await self.start_conductor()
            self.slots = [self.start_worker(slot) for slot in range(self.opts.agents)]
            for agent_id in self.agent_ids[self.opts.agents :]:
                self.start_agent(agent_id, f"{agent_id}-0", CHAOS_DEGRADED="1")
            database = conninfo(self.database_url)
            async with (
                await psycopg.AsyncConnection.connect(database, autocommit=True) as db,
                httpx.AsyncClient(base_url=self.url, timeout=30) as api,
            ):
                chaos = (self.kill_agents(), self.restart_conductor(), self.watch_agents())
                tasks = [asyncio.create_task(job) for job in (self.dispatch_all(api), *chaos)]
                try:
                    settled = await self.monitor(redis, db)
                finally:
                    for task in tasks:
                        task.cancel()
                    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
                for failure in [o for o in outcomes if isinstance(o, Exception)][:1]:
                    raise failure
                await self.stop_everything()
                failed = await self.report(redis, db, settled, time.monotonic() - started)
        finally:
            await self.stop_everything()
            if not self.opts.keep:
                # Staged-commit intents, consumer leases, dispatch idempotency markers.
                keys = [self.stream, f"{self.stream}:dlq"]
                for glob in ("rig:staged:{}:*", "rig:consumer:{}:*", "{}:dispatched:*"):
                    keys += [k async for k in redis.scan_iter(glob.format(self.stream), 1000)]
                with contextlib.suppress(Exception):
                    await redis.delete(*keys)
            await redis.aclose()
        if failed or self.opts.keep:
            print(f"logs and effects: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return 1 if failed else 0

    async def report(self, redis: Any, db: Any, settled: bool, elapsed: float) -> bool:
        """Print the counts; True when the run failed."""
        final = await self.snapshot(redis, db)
        per_issue = Counter(f.get("issueId", "") for _, f in await redis.xrange(self.stream))
        twice = sorted(issue for issue, n in per_issue.items() if n > 1)
        where, args = "WHERE tenant = %s AND stream = %s", (self.tenant, self.stream)
        rows = await db.execute(f"SELECT count(*) FROM events {where} AND fenced", args)
        fenced = await rows.fetchone()
        rows = await db.execute(
            f"SELECT detail->>'reason', sum(cardinality(entry_ids)) FROM events {where} "
            "AND kind = 'RECLAIMED' GROUP BY 1 ORDER BY 1",
            args,
        )
        by_reason = ", ".join(f"{reason} {n}" for reason, n in await rows.fetchall()) or "none"
        effects: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for path in self.out.glob("*.json"):
            effect = json.loads(path.read_text())
            effects[effect["issueId"]].append((effect["entryId"], int(effect["attempt"])))
        logs = [c.log.read_text(errors="replace") for c in self.conductors]
        reclaims = sum(s == self.stream for log in logs for s in RECLAIMED.findall(log))
        by_reaper = sum(s == self.stream for log in logs for s in DEAD_LETTERED.findall(log))

        dispatched, completed = set(self.entries), set(final.completed)
        letters = final.dead_lettered
        lost = dispatched - completed - letters - final.unsettled()
        double = {  # more than one committed file or accepted attempt, or a file not accepted
            issue
            for issue in completed | set(effects)
            if len(effects[issue]) > 1
            or len(final.completed.get(issue, ())) > 1
            or any(f not in final.completed.get(issue, ()) for f in effects[issue])
        }
        missing = {i for i in completed - self.poison if not effects[i] and i not in double}
        other_letters = letters - self.poison
        opts = self.opts
        lines = [
            f"rig-conductor chaos soak {self.run_id}: {opts.issues} issues ({len(self.poison)} "
            f"poison), {opts.agents} agents, an agent SIGKILLed every {opts.kill_every:g}s, "
            f"{opts.conductor_restarts} conductor restarts, {opts.degraded_agents} always-degraded "
            f"agents, the first attempt of every {opts.hang_every}th issue hung",
            f"dispatched: {len(dispatched)}",
            f"completed: {len(completed)}",
            f"dead-lettered: {len(letters)} (poison {len(letters & self.poison)} of "
            f"{len(self.poison)}, other {len(other_letters)}; by the reaper {by_reaper})",
            f"lost: {len(lost)}",
            f"unfinished: {len(dispatched - completed - letters)}",
            f"pending entries left: {len(final.pending)} (undelivered: {len(final.undelivered)})",
            f"double-committed effects: {len(double)}",
            f"missing effects: {len(missing)}",
            f"fenced reports: {fenced[0] if fenced else 0}",
            f"reclaims: {reclaims}",
            f"reclaims by reason: {by_reason}",
            f"issues dispatched twice: {len(twice)}",
            f"orphaned staged files: {len(list(self.out.glob('.*.tmp')))}",
            *(f"{name}: {self.tally[name]}" for name in TALLIES),
            f"duration: {elapsed:.1f}s",
        ]
        for entry_id, (issue, holder, deliveries) in sorted(final.pending.items())[:10]:
            state = "done" if issue in final.done else "not done"
            held = f"held by {holder} after {deliveries} deliveries"
            lines.append(f"pending {entry_id}: issue {issue} ({state}), {held}")
        problems = {"lost": lost, "double-committed": double, "missing effects": missing}
        problems |= {"non-poison dead-lettered": other_letters, "dispatched twice": set(twice)}
        problems |= {"not dispatched": set(self.issues) - dispatched}
        for name, issues in problems.items():
            if issues:
                shown = sorted(issues)
                lines.append(f"{name}: {', '.join(shown[:20])}{' ...' if len(shown) > 20 else ''}")
        if not settled:
            lines.append(f"did not settle within {opts.timeout:g}s")
        failed = any(problems.values()) or not settled
        lines.append(f"result: {'FAIL' if failed else 'PASS'}")
        print("\n".join(lines), flush=True)
        return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI run: 100 issues, 3 agents")
    parser.add_argument("--issues", type=int, help="issues to dispatch (1000; quick 100)")
    parser.add_argument("--agents", type=int, help="agent processes (6; quick 3)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--conductor-restarts", type=int, help="(2; quick 1)")
    parser.add_argument("--poison", type=int, help="issues whose handler always fails (5; 2)")
    parser.add_argument("--degraded-agents", type=int, default=1, help="always degraded (1)")
    parser.add_argument("--hang-every", type=int, help="first attempts that hang (50; 20)")
    parser.add_argument("--rate", type=float, help="dispatches a second, 0 = at once (25; 8)")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds (600; 120)")
    parser.add_argument("--seed", type=int, help="random seed (kills, poison issues)")
    parser.add_argument("--keep", action="store_true", help="keep logs, effects and Redis keys")
    import harness  # not at the top: the agent processes import this module for `handle`

    opts = harness.options(
        parser, issues=(1000, 100), agents=(6, 3), conductor_restarts=(2, 1), poison=(5, 2),
        hang_every=(50, 20), rate=(25.0, 8.0), timeout=(600.0, 120.0),
    )  # fmt: skip
    if opts.agents < 2 or opts.issues < 1 or opts.kill_every <= 0:
        parser.error("needs --agents >= 2, --issues >= 1, --kill-every > 0")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)-7s %(message)s")
    logger.setLevel(logging.INFO)
    try:
        with harness.servers() as found:
            soak = Soak(opts, found.redis_url, found.database_url, harness.free_port())
            return asyncio.run(soak.run())
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
