"""Chaos soak: while issues flow, agents are SIGKILLed at random, the conductor is restarted,
PostgreSQL is stopped and started, every conductor is stopped for longer than RIG_AGENT_DOWN_MS,
and Redis is restarted empty. A soak test rather than a benchmark: it checks that no work is
lost, done twice or left without its output, and that no live agent loses its work to a
blind spell; each issue that went wrong is printed with its timeline. It runs on a
PostgreSQL and a Redis of its own (`private_servers`), so it can stop and start them.

    .venv/bin/python bench/chaos.py [--quick] [--issues 1000] [--agents 6] [--seed N] [--keep]
        [--fleet python|typescript|mixed] [--groups N] [--agent-users]

`--fleet`: the agents' runtime, the Python `rig-conductor agent` (default), the TypeScript
`rig-agent` (clients/typescript; the soak refuses to start, naming `cd clients/typescript &&
npm ci && npm run build`, when it is not built), or `mixed`: every other agent process of a
group is a TypeScript one, in the group with the Python ones. Both run the same handler
(`handle` below; `chaos_handler.mjs`). `--groups N`: N consumer groups read the one stream,
each with its own agents; work is owned per group, so each must finish every issue once, and
lost, doubled and missing work is counted per group. `--agent-users`: every agent id gets its
own least-privilege Redis user as `rig-conductor redis-acl` prints it (the conductor keeps the
default user). A Redis restarted empty would come back without them: the soak keeps them in
the private Redis's aclfile (`ACL SAVE`), as an operator would, and the restarted server loads
them at start. Needs Redis 7 (ACL selectors); refused on an older redis-server.

The faults are in `chaos_faults`, the observations and the verdict in `chaos_report`, the
fleet's seats and runtimes in `chaos_fleet`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import chaos_report

# Light imports only up here: the agent processes import this module for `handle`.
logger = logging.getLogger("chaos")
BENCH_DIR = str(Path(__file__).resolve().parent)
STOP_TIMEOUT_S = 40.0  # serve drains for up to 30 s, an agent finishes its entry for up to 30 s
STALL_TIMEOUT_S, DRAIN_TIMEOUT_S, PROGRESS_EVERY_S = 60.0, 15.0, 5.0
ENTRY_DEADLINE_MS = "2000"
AGENT_DOWN_MS = 3000
# Not the default 5: every outage costs the entries agents hold meanwhile a delivery or two
# (their attempts cannot report progress, so rule 4b moves them once the conductor hears
# again), and with agents SIGKILLed every 2 s an unlucky entry would wear out undone.
MAX_DELIVERIES = "10"


def handle(entry: Any) -> None:
    """The Python agents' handler; `chaos_handler.mjs` is the same for TypeScript agents.
    Sleep 5 ms, then stage `<issueId>--<entryId>.a<attempt>.json`; poison raises. With
    CHAOS_DEGRADED every call raises Degraded (out of quota); with CHAOS_HANG_EVERY=n the first
    attempt of every n-th issue hangs for 20 s without progress (a deadlocked CLI)."""
    from rig_conductor.agent import Degraded

    issue = entry.fields["issueId"]
    if os.environ.get("CHAOS_DEGRADED"):
        # Its entries wait for the reaper's rule 3b. After a SIGKILLed conductor the next one
        # reaps only once the dead one's lease row has run out (up to 20 s): re-reading every
        # 6 s, an entry reaches RIG_MAX_DELIVERIES after 25 s or more, not in the meantime.
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
    """One process of the run, logging to its own file. `ended_at` (seconds since the epoch) is
    when it was stopped, or, having exited by itself, when it was last seen alive."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    seen_alive: float = field(default_factory=time.time)
    stopping: bool = False  # the soak is stopping it: its exit is no crash

    def alive(self) -> bool:
        if self.process.poll() is None:
            self.seen_alive = time.time()
            return True
        if self.ended_at is None:
            self.ended_at = self.seen_alive
        return False

    async def stop(self, sig: signal.Signals = signal.SIGTERM) -> int:
        self.stopping = True
        self.process.send_signal(sig)  # nothing once it has exited
        try:
            code = await asyncio.to_thread(self.process.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("%s did not stop within %.0fs: SIGKILL", self.name, STOP_TIMEOUT_S)
            self.process.kill()
            code = await asyncio.to_thread(self.process.wait)
        self.ended_at = self.ended_at or time.time()
        return code


class Soak:
    def __init__(
        self,
        opts: argparse.Namespace,
        postgres: Any,
        redis_server: Any,
        port: int,
        typescript: list[str],
    ):
        import chaos_fleet

        self.opts, self.postgres, self.redis_server = opts, postgres, redis_server
        self.redis_url, self.database_url = redis_server.url, postgres.url("rig_chaos")
        self.typescript = typescript  # the TypeScript runtime's command, if the fleet has one
        self.run_id = uuid.uuid4().hex[:8]
        self.stream, self.tenant = f"chaos:{self.run_id}", f"chaos-{self.run_id}"
        self.groups = chaos_fleet.group_names(opts.groups)
        self.workdir = Path(tempfile.mkdtemp(prefix=f"rig-chaos-{self.run_id}-"))
        self.out, self.logs = self.workdir / "effects", self.workdir / "logs"
        for group in self.groups:  # a group's attempts are its own: so are its files
            (self.out / group).mkdir(parents=True)
        self.logs.mkdir()
        self.rng = random.Random(opts.seed)
        self.issues = [f"chaos-{self.run_id}-{n:05d}" for n in range(opts.issues)]
        self.poison = set(self.rng.sample(self.issues, min(opts.poison, len(self.issues))))
        self.url = f"http://127.0.0.1:{port}"
        self.seats = chaos_fleet.seats(
            groups=opts.groups, agents=opts.agents, degraded=opts.degraded_agents, fleet=opts.fleet
        )
        self.workers = [seat for seat in self.seats if not seat.degraded]
        self.agent_ids = [seat.agent_id for seat in self.seats]
        self.passwords: dict[str, str] = {}  # --agent-users: Redis user -> password
        self.users_seen: set[str] = set()  # the Redis users agents were seen connected as
        self.entries: dict[str, str] = {}  # issue -> entry id
        self.children: list[Child] = []
        self.conductors: list[Child] = []
        self.slots: list[Child] = []  # the live process of each of `workers`
        self.incarnations = [0] * len(self.workers)
        self.tally: Counter[str] = Counter()
        self.latest: dict[str, Any] = {}  # group -> its last chaos_report.Snapshot
        self.dispatched = asyncio.Event()
        self.faults_over = asyncio.Event()
        self.faults_done = 0
        self.faults: list[Any] = []  # chaos_timeline.Fault, each as it was injected

    def done_everywhere(self) -> set[str]:
        """The issues every group has finished (completed or dead-lettered), as last seen."""
        if len(self.latest) < len(self.groups):
            return set()
        return set.intersection(*(snapshot.done for snapshot in self.latest.values()))

    # Processes.
    def spawn(self, name: str, argv: list[str], **env: str) -> Child:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        environment |= {"RIG_REDIS_URL": self.redis_url, "RIG_DISPATCH_STREAM": self.stream}
        log = self.logs / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                argv,
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
        env |= {"RIG_ENTRY_STALE_MS": "1000", "RIG_AGENT_DOWN_MS": str(AGENT_DOWN_MS)}
        # No start-up delay, and agents heartbeat a third of RIG_AGENT_DOWN_MS apart: after an
        # outage the first scans come before every live agent is heard again, so only reaper
        # rule 3's blind spells keep live agents from being judged down (the report counts it).
        env |= {"RIG_SCAN_INTERVAL_S": "0.5", "RIG_STARTUP_DELAY_S": "0"}
        env |= {"RIG_DEGRADED_GRACE_MS": "1000", "RIG_ENTRY_DEADLINE_MS": ENTRY_DEADLINE_MS}
        env |= {"RIG_MAX_DELIVERIES": MAX_DELIVERIES}
        env |= {"RIG_K8S_ENABLED": "false", "RIG_ALLOW_ANONYMOUS": "true"}
        env |= {"RIG_LOG_FORMAT": "json"}  # reclaims with their reason and time, for the report
        child = self.spawn(name, [sys.executable, "-m", "rig_conductor", "serve"], **env)
        self.conductors.append(child)
        try:
            await asyncio.to_thread(harness.wait_ready, child.process, f"{self.url}/readyz")
        except harness.BenchError as exc:
            raise RuntimeError(f"{exc}: {child.log.read_text()[-2000:]}") from None

    def start_agent(self, seat: Any, consumer: str, **env: str) -> Child:
        """An agent process in `seat` (a `chaos_fleet.Seat`), of its runtime, as `consumer`."""
        import chaos_fleet

        python_path = [p for p in (os.environ.get("PYTHONPATH"), BENCH_DIR) if p]  # for handle
        env |= {"PYTHONPATH": os.pathsep.join(python_path)}
        env |= {"CHAOS_OUT_DIR": str(self.out / seat.group)}
        env |= {"RIG_CONDUCTOR_URL": self.url, "RIG_ENTRY_DEADLINE_MS": ENTRY_DEADLINE_MS}
        env |= {"RIG_MAX_DELIVERIES": MAX_DELIVERIES}
        env |= {"RIG_HEARTBEAT_INTERVAL_S": str(AGENT_DOWN_MS / 3000), "RIG_SCAN_INTERVAL_S": "1"}
        env |= {"RIG_LOG_FORMAT": "json"}  # its lines about an entry, for the report's timelines
        if self.passwords:
            user = f"rig-agent-{seat.agent_id}"
            env["RIG_REDIS_URL"] = chaos_fleet.user_url(self.redis_url, user, self.passwords[user])
        if seat.degraded:
            env["CHAOS_DEGRADED"] = "1"
        argv = chaos_fleet.agent_command(seat, stream=self.stream, typescript=self.typescript)
        return self.spawn(consumer, argv, CONSUMER_ID=consumer, **env)

    def start_worker(self, slot: int) -> Child:
        """The agent of `slot`, as a new pod: a new consumer name."""
        self.incarnations[slot] += 1
        seat = self.workers[slot]
        consumer = f"{seat.agent_id}-{self.incarnations[slot]}"
        return self.start_agent(seat, consumer, CHAOS_HANG_EVERY=str(self.opts.hang_every))

    async def stop_everything(self) -> None:
        agents = [c for c in self.children if c.alive() and c not in self.conductors]
        await asyncio.gather(*(agent.stop() for agent in agents))
        await asyncio.gather(*(c.stop() for c in self.conductors if c.alive()))

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

    async def monitor(self, redis: Any, db: chaos_report.Database) -> bool:
        """Until every dispatched issue is settled in every group and every scheduled fault is
        over (True; then up to DRAIN_TIMEOUT_S more for the pending lists to empty), or
        --timeout or STALL_TIMEOUT_S without progress (False). Looks again later while a server
        is down."""
        import psycopg
        from redis.exceptions import RedisError

        started = time.monotonic()
        deadline = started + self.opts.timeout
        settled, faults, last_change = 0, 0, started
        next_report = started + PROGRESS_EVERY_S
        drain_until: float | None = None
        while (now := time.monotonic()) < deadline:
            try:
                await self.look(redis, db)
            except (psycopg.Error, RedisError, OSError) as exc:
                logger.debug("No snapshot (%s); looking again", exc)
                await asyncio.sleep(0.5)
                continue
            latest = list(self.latest.values())
            over = self.dispatched.is_set() and self.faults_over.is_set()
            if over and set(self.entries) <= self.done_everywhere():
                # An entry completed by an agent killed before its XACK stays pending until
                # reclaimed (its next owner finds it done and acks it): give that time.
                drain_until = drain_until or min(deadline, now + DRAIN_TIMEOUT_S)
                if not any(s.pending or s.undelivered for s in latest):
                    return True
            done = sum(len(s.done) for s in latest)
            if (done, self.faults_done) != (settled, faults):
                settled, faults, last_change = done, self.faults_done, now
            elif now - last_change > STALL_TIMEOUT_S:
                logger.error("No issue settled for %.0fs: stopping", STALL_TIMEOUT_S)
                return False
            if now >= next_report:
                next_report += PROGRESS_EVERY_S
                completed = "/".join(str(len(s.completed)) for s in latest)
                pending = "/".join(str(len(s.unsettled())) for s in latest)
                logger.info(
                    "%5.1fs: dispatched, completed, pending (%d, %s, %s)",
                    now - started,
                    len(self.entries),
                    completed,
                    pending,
                )
            await asyncio.sleep(0.5)
            if drain_until is not None and time.monotonic() >= drain_until:
                logger.warning("Every issue is settled, but entries are still pending")
                return True
        return drain_until is not None

    async def look(self, redis: Any, db: chaos_report.Database) -> None:
        """Each group's snapshot, and the Redis users agents are connected as."""
        import chaos_fleet
        from chaos_report import snapshot

        for group in self.groups:
            self.latest[group] = await snapshot(
                redis, db, tenant=self.tenant, stream=self.stream, group=group
            )
        if self.passwords:
            self.users_seen |= await chaos_fleet.users_connected(redis)

    # The run.
    async def run(self) -> int:
        import httpx

        import chaos_faults
        import chaos_fleet
        import chaos_report
        from harness import conninfo, redis_kit

        started = time.monotonic()
        redis = redis_kit.connect(self.redis_url)
        db = chaos_report.Database(conninfo(self.database_url))
        failed = True
        try:
            if self.opts.agent_users:
                self.passwords = await chaos_fleet.apply_agent_users(
                    redis, self.agent_ids, stream=self.stream
                )
            await self.start_conductor()
            self.slots = [self.start_worker(slot) for slot in range(len(self.workers))]
            for seat in self.seats:
                if seat.degraded:
                    self.start_agent(seat, f"{seat.agent_id}-0")
            async with httpx.AsyncClient(base_url=self.url, timeout=30) as api:
                chaos = [chaos_faults.kill_agents(self), chaos_faults.watch_agents(self)]
                chaos.append(chaos_faults.scheduled(self))
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
                elapsed = time.monotonic() - started
                failed = await chaos_report.report(self, redis, db, settled, elapsed)
        finally:
            await self.stop_everything()
            await db.close()
            await redis.aclose()
            if failed or self.opts.keep:
                for log in (self.postgres.directory / "server.log", self.redis_server.log):
                    with contextlib.suppress(OSError):
                        shutil.copy(log, self.logs / f"server-{log.name}")
        if failed or self.opts.keep:
            print(f"logs and effects: {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI run: 100 issues, 3 agents")
    parser.add_argument("--issues", type=int, help="issues to dispatch (1000; quick 100)")
    parser.add_argument("--agents", type=int, help="agent processes (6; quick 3)")
    parser.add_argument("--kill-every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--conductor-restarts", type=int, help="(2; quick 1)")
    parser.add_argument("--postgres-outages", type=int, help="PostgreSQL stopped (2; quick 1)")
    parser.add_argument("--conductor-outages", type=int, help="every conductor stopped (2; 1)")
    parser.add_argument("--redis-restarts", type=int, help="Redis restarted empty (1; 1)")
    parser.add_argument(
        "--outage-s", type=float, default=2 * AGENT_DOWN_MS / 1000,
        help=f"length of each outage, over RIG_AGENT_DOWN_MS ({2 * AGENT_DOWN_MS / 1000:g})",
    )  # fmt: skip
    parser.add_argument("--poison", type=int, help="issues whose handler always fails (5; 2)")
    parser.add_argument("--degraded-agents", type=int, default=1, help="always degraded (1)")
    parser.add_argument("--hang-every", type=int, help="first attempts that hang (50; 20)")
    parser.add_argument("--rate", type=float, help="dispatches a second, 0 = at once (25; 5)")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds (900; 180)")
    parser.add_argument("--seed", type=int, help="random seed (kills, poison issues)")
    parser.add_argument("--keep", action="store_true", help="keep logs and effects")
    parser.add_argument(
        "--fleet", choices=("python", "typescript", "mixed"), default="python",
        help="the agents' runtime; mixed: every other agent of a group is TypeScript (python)",
    )  # fmt: skip
    parser.add_argument(
        "--groups", type=int, default=1,
        help="consumer groups reading the one stream, each with its own agents (1)",
    )  # fmt: skip
    parser.add_argument(
        "--agent-users", action="store_true",
        help="each agent id its own least-privilege Redis user (redis-acl); needs Redis 7",
    )  # fmt: skip
    import chaos_fleet
    import harness  # not at the top: the agent processes import this module for `handle`
    import private_servers

    opts = harness.options(
        parser, issues=(1000, 100), agents=(6, 3), conductor_restarts=(2, 1), poison=(5, 2),
        postgres_outages=(2, 1), conductor_outages=(2, 1), redis_restarts=(1, 1),
        hang_every=(50, 20), rate=(25.0, 5.0), timeout=(900.0, 180.0),
    )  # fmt: skip
    if opts.agents < 2 or opts.issues < 1 or opts.kill_every <= 0:
        parser.error("needs --agents >= 2, --issues >= 1, --kill-every > 0")
    if opts.outage_s * 1000 <= AGENT_DOWN_MS:
        parser.error(f"--outage-s must be longer than RIG_AGENT_DOWN_MS ({AGENT_DOWN_MS} ms)")
    if opts.groups < 1:
        parser.error("needs --groups >= 1")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)-7s %(message)s")
    logger.setLevel(logging.INFO)
    try:
        typescript = chaos_fleet.typescript_command() if opts.fleet != "python" else []
        if opts.agent_users:
            chaos_fleet.check_agent_users()
        with (
            private_servers.private_postgres() as postgres,
            private_servers.private_redis(aclfile=opts.agent_users) as redis_server,
        ):
            from rig_conductor.adapters.postgres import migrations

            migrations.upgrade(postgres.create_database("rig_chaos"))
            soak = Soak(opts, postgres, redis_server, harness.free_port(), typescript)
            return asyncio.run(soak.run())
    except chaos_fleet.FleetError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    except private_servers.ServerError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("chaos: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
