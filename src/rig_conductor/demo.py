"""`rig-conductor demo`: the whole story on embedded Redis and PostgreSQL, then a live console.

The conductor runs for real: the HTTP API under uvicorn with its scheduled reaper. Six issues
are dispatched through `POST /api/events`. The agents run the real agent runtime (`run_agent`,
in-process), reading `rig:dispatch` in one consumer group and heartbeating over HTTP.
`builder-b` runs three workers; each takes an issue and hangs in its build. `builder-a` builds
the other three issues, then builder-b's node dies: the workers stop dead, nothing acked, no
more heartbeats. On short demo thresholds the reaper sees builder-b go silent and reclaims its
three entries to builder-a, which builds them as a new attempt (builder-b's attempts are fenced
off). Every move goes to builder-a at once, by reaper rule 5 (docs/rules.md): builder-a is up,
heard and idle before builder-b dies. The workers fall silent a moment apart, so a scan may
find some silent while another is still within its last heartbeat, and so still a target
holding one entry; idle builder-a, the fresher, takes two before that worker would rank level
with it. With a fourth worker, the third entry could go to that worker, and move again one
scan later. Every build writes an artifact
through `entry.stage()`, published only once the conductor has accepted the completion; the
demo reports who built each issue from those artifacts.

Then, unless told to stop there (`once`: `--once`, or a stdout that is no terminal, as `cli`
decides), the demo stays up for a person to look around until Ctrl-C: builder-a
and builder-c keep heartbeating and building, and a new issue is dispatched every few seconds,
so the console shows a live fleet and moving work. stdout carries the results only (the
console's URL, the summary after a final scan); the story's log lines go to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import tempfile
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from rig_conductor.adapters.postgres import migrations
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.agent import Entry, Handler, run_agent
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.app import create_app, stop_listening
from rig_conductor.domain import EventKind
from rig_conductor.embedded import EmbeddedUnavailable, embedded_services
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

# Quiet unless `demo -v`: the migrations' steps, pgserver's commands, uvicorn's start-up.
CHATTY_LOGGERS = ("alembic", "pgserver", "uvicorn.error")

STREAM = "rig:dispatch"
GROUP = "builders"
LIVE = ("builder-a", "builder-a-rig-agent-runtime-0")
# Joins builder-a once the story is told, so the live console shows a fleet of two.
HELPER = ("builder-c", "builder-c-rig-agent-runtime-0")
DOOMED_AGENT = "builder-b"
DOOMED = tuple(f"{DOOMED_AGENT}-rig-agent-runtime-{n}" for n in range(3))
ISSUES = [f"rc-{n}" for n in range(101, 107)]
PREFERRED_PORT = 8080
BUILD_S = 0.1
BLOCK_MS = 250  # short blocking reads: builder-a stops promptly at the end
STOP_TIMEOUT_S = 10.0
# After the story: a new issue this often, each built this long, so the console shows work
# pending and done; well inside the entry staleness, so a live builder never loses one.
TRICKLE_EVERY_S = 3.0
TRICKLE_BUILD_S = 1.0


# --watch: time to open the console before the story starts, and thresholds slow enough to
# see builder-b's consumers hold their entries, turn down, and lose them to builder-a.
WATCH_LEAD_S = 10.0
WATCH_AGENT_DOWN_MS = 10_000
WATCH_SCAN_INTERVAL_S = 5.0


def run(*, timeout_s: float, log_format: str, once: bool = False, watch: bool = False) -> int:
    """The story, then (unless `once`) a live fleet until Ctrl-C. 0 when the story completed."""
    try:
        with embedded_services() as services, _listening_socket() as listener:
            settings = Settings(
                redis_url=services.redis_url,
                database_url=services.database_url,
                http_host="127.0.0.1",
                http_port=listener.getsockname()[1],
                dispatch_stream=STREAM,
                streams=(STREAM,),
                agent_ids=(LIVE[0], DOOMED_AGENT, HELPER[0]),
                entry_stale_ms=2_000,
                agent_down_ms=WATCH_AGENT_DOWN_MS if watch else 3_000,
                scan_interval_s=WATCH_SCAN_INTERVAL_S if watch else 1.0,
                startup_delay_s=0.0,
                api_tokens=(),
                allow_anonymous=True,  # the demo is local and open on purpose
                k8s_enabled="false",
                log_format=log_format,
            )
            migrations.upgrade(settings.sqlalchemy_url)
            lead_s = WATCH_LEAD_S if watch else 0.0
            return asyncio.run(_run(settings, listener, timeout_s, not once, lead_s))
    except EmbeddedUnavailable as exc:
        logger.error("%s", exc)
        return 2


def say(line: str) -> None:
    """A result, on stdout: the console's URL, the summaries."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def _listening_socket() -> Iterator[socket.socket]:
    """A socket listening on 127.0.0.1:8080 when that is free, else on any free port.

    It listens from here on and uvicorn serves on this very socket, so no other process (a second
    demo started at the same moment) can take the port between choosing it and serving on it.
    """
    try:
        sock = _listen_on(PREFERRED_PORT)
    except OSError:
        sock = _listen_on(0)
    with sock:
        yield sock


def _listen_on(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server, leaving Ctrl-C to the demo: it stops the fleet before the server. The
    app is told when it stops taking connections, as under `serve` (`app.stop_listening`)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stop_listening(self.config.app)
        await super().shutdown(sockets)


async def _run(
    settings: Settings, listener: socket.socket, timeout_s: float, live: bool, lead_s: float
) -> int:
    server = _Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.http_host,
            port=settings.http_port,
            log_config=None,
            access_log=False,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    # uvicorn exposes start-up as a flag, not an event.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if serving.done():
        return 1  # uvicorn logged why
    url = f"http://{settings.http_host}:{settings.http_port}"
    logger.info("Conductor serving at %s (try %s/api/streams)", url, url)
    say(f"Console: {url}/ui")
    agents = AgentSettings(
        redis_url=settings.redis_url,
        conductor_url=url,
        api_token=None,
        heartbeat_interval_s=0.5,
        scan_interval_s=1.0,
        max_deliveries=settings.max_deliveries,
        dispatch_stream=STREAM,
        log_format=settings.log_format,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    redis = redis_client.connect(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="rig-demo-") as scratch:
            async with httpx.AsyncClient(base_url=url, timeout=10) as api:
                crew = _Crew(agents, Path(scratch))
                story = _story(api, redis, crew, timeout_s, lead_s, live=live)
                if not await _unless_stopped(story, stopping, crew):
                    return 1
                if live:
                    await _live(api, redis, crew, stopping)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await redis.aclose()
        server.should_exit = True
        await serving
    return 0


async def _unless_stopped(
    story: Coroutine[Any, Any, bool], stopping: asyncio.Event, crew: _Crew
) -> bool:
    """The story's outcome; False, with the crew stopped, when Ctrl-C comes first."""
    told = asyncio.create_task(story)
    interrupted = asyncio.create_task(stopping.wait())
    await asyncio.wait({told, interrupted}, return_when=asyncio.FIRST_COMPLETED)
    interrupted.cancel()
    if told.done():
        return told.result()
    told.cancel()
    await asyncio.gather(told, return_exceptions=True)
    await crew.stop()
    logger.warning("Demo interrupted before the story's end")
    return False


async def _story(
    api: httpx.AsyncClient,
    redis: AnyRedis,
    crew: _Crew,
    timeout_s: float,
    lead_s: float,
    *,
    live: bool,
) -> bool:
    """builder-b takes three issues and dies; the reaper hands them to builder-a. Prints the
    summary once a final scan has measured the end; True when every issue was built."""
    completed: dict[str, str] = {}
    if lead_s:
        logger.info("The story starts in %.0f s: open the console now", lead_s)
        await asyncio.sleep(lead_s)
    try:
        async with asyncio.timeout(timeout_s):
            for issue in ISSUES:
                await _dispatch(api, issue)  # the conductor logs each dispatch
            await crew.doomed_take_work()
            # builder-a is up, heard, and idle before builder-b dies: the reaper's only
            # eligible target with nothing pending, so every move goes to it at once.
            crew.start_live(*LIVE)
            await _watch(crew.artifacts, redis, completed, len(ISSUES) - len(DOOMED))
            await crew.kill_doomed()
            await _watch(crew.artifacts, redis, completed, len(ISSUES))
    except TimeoutError:
        logger.error("Demo timed out: %d of %d issues done", len(completed), len(ISSUES))
        await crew.stop()
        return False
    if not live:
        await crew.stop()  # builder-a finishes its current step: nothing is cut off mid-way
    figures = await _figures(api)
    say(
        f"Demo done: {len(completed)} of {len(ISSUES)} issues completed, all by "
        f"{', '.join(sorted(set(completed.values())))}; {figures.reclaimed} reclaimed from "
        f"{DOOMED_AGENT}. Pending now: {json.dumps(figures.pending)}"
    )
    return True


async def _live(
    api: httpx.AsyncClient, redis: AnyRedis, crew: _Crew, stopping: asyncio.Event
) -> None:
    """A live fleet until Ctrl-C: builder-a and builder-c build a new issue every few seconds.
    On Ctrl-C, no more dispatches, the builders finish their current step, and a final scan
    measures the end for the last summary."""
    crew.build_s = TRICKLE_BUILD_S
    crew.start_live(*HELPER)
    logger.warning(
        "The demo keeps running: %s and %s build a new issue every %.0f s; the console shows "
        "them live. Press Ctrl-C to stop (`--once` exits after the story)",
        LIVE[0],
        HELPER[0],
        TRICKLE_EVERY_S,
    )
    dispatched = len(ISSUES)
    while not stopping.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), TRICKLE_EVERY_S)
            break
        dispatched += 1
        issue = f"rc-{100 + dispatched}"
        try:
            await _dispatch(api, issue)
        except httpx.HTTPError as exc:
            logger.warning("Could not dispatch %s: %s", issue, exc)
            dispatched -= 1
    await crew.stop()
    built = len(await asyncio.to_thread(_published, crew.artifacts, set()))
    figures = await _figures(api)
    say(
        f"Demo stopped: {built} of {dispatched} issues completed; {figures.reclaimed} reclaimed "
        f"from {DOOMED_AGENT}. Pending now: {json.dumps(figures.pending)}"
    )


@dataclass(frozen=True)
class Figures:
    """What the API says after a scan the demo asked for: the summary quotes only these."""

    reclaimed: int
    pending: dict[str, int]


async def _figures(api: httpx.AsyncClient) -> Figures:
    """A scan now, then the groups' pending counts it measured and the reclaims counted."""
    scanned = await api.post("/api/reaper/scan")
    if scanned.status_code != 200:  # 409: another replica's reaper is active (none in the demo)
        logger.warning("No scan for the summary (%d): it quotes the last scan", scanned.status_code)
    streams = (await api.get("/api/streams")).json()
    metrics = (await api.get("/metrics")).text
    return Figures(
        reclaimed=reclaimed_total(metrics),
        pending={g["group"]: g["pending"] for g in streams},
    )


def reclaimed_total(metrics: str) -> int:
    """The sum of `rig_reclaimed_entries_total` over its labels, in Prometheus text."""
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            if family.name == "rig_reclaimed_entries"
            for sample in family.samples
            if sample.name == "rig_reclaimed_entries_total"
        )
    )


async def _dispatch(api: httpx.AsyncClient, issue: str) -> str:
    answer = await api.post(
        "/api/events",
        json={
            "type": EventKind.ISSUE_ASSIGNED,
            "issueId": issue,
            "agentId": "builder",
            "payload": {"title": f"Build {issue}"},
        },
    )
    answer.raise_for_status()
    entry_id: str = answer.json()["entryId"]
    return entry_id


class _Crew:
    """builder-b's three workers, which die mid-build; builder-a, which survives; builder-c,
    which joins it in the live fleet."""

    def __init__(self, settings: AgentSettings, artifacts: Path) -> None:
        self.settings = settings
        self.artifacts = artifacts
        self.doomed: list[asyncio.Task[None]] = []
        self.building: dict[str, Entry] = {}
        self.all_building = asyncio.Event()
        self.live: list[asyncio.Task[None]] = []
        self.live_stop = asyncio.Event()
        self.build_s = BUILD_S

    async def doomed_take_work(self) -> None:
        """Start builder-b's workers; return once each is stuck in the build of one issue."""
        for consumer in DOOMED:
            self.doomed.append(self._worker(self._hang, DOOMED_AGENT, consumer))
        await self.all_building.wait()

    async def _hang(self, entry: Entry) -> None:
        logger.info("%s is building %s (%s)", entry.consumer, entry.issue_id, entry.id)
        self.building[entry.consumer] = entry
        if len(self.building) == len(DOOMED):
            self.all_building.set()
        await asyncio.Event().wait()  # a build that never finishes

    async def kill_doomed(self) -> None:
        """builder-b's node dies: its runtimes stop dead, without acking or heartbeating."""
        for task in self.doomed:
            task.cancel()
        await asyncio.gather(*self.doomed, return_exceptions=True)
        unacked = sorted(self.building.values(), key=lambda entry: entry.id)
        logger.warning(
            "%s died mid-build, never acking %s",
            DOOMED_AGENT,
            ", ".join(f"{entry.issue_id} ({entry.id}) on {entry.consumer}" for entry in unacked),
        )

    def start_live(self, agent_id: str, consumer: str) -> None:
        self.live.append(self._worker(self._build, agent_id, consumer, stop=self.live_stop))

    def _worker(
        self, handler: Handler, agent_id: str, consumer: str, *, stop: asyncio.Event | None = None
    ) -> asyncio.Task[None]:
        """One worker of the demo's group on its stream, as a task named after its consumer."""
        agent = run_agent(
            handler,
            agent_id=agent_id,
            group=GROUP,
            settings=self.settings,
            stream=STREAM,
            consumer=consumer,
            stop=stop,
            block_ms=BLOCK_MS,
        )
        return asyncio.create_task(agent, name=consumer)

    async def _build(self, entry: Entry) -> None:
        await asyncio.sleep(self.build_s)  # the work
        artifact = {
            "issueId": entry.issue_id,
            "entryId": entry.id,
            "consumer": entry.consumer,
            "attempt": entry.attempt,
        }
        staged = entry.stage(self.artifacts / f"{entry.issue_id}.json")
        await asyncio.to_thread(staged.write_text, json.dumps(artifact))

    async def stop(self) -> None:
        for task in self.doomed:
            task.cancel()
        await asyncio.gather(*self.doomed, return_exceptions=True)
        self.live_stop.set()
        for task in self.live:
            try:
                await asyncio.wait_for(task, STOP_TIMEOUT_S)
            except TimeoutError:
                logger.warning("%s did not stop within %.0fs", task.get_name(), STOP_TIMEOUT_S)
            except Exception as exc:
                logger.error("%s failed: %s: %s", task.get_name(), type(exc).__name__, exc)
        self.live.clear()


async def _watch(artifacts: Path, redis: AnyRedis, completed: dict[str, str], issues: int) -> None:
    """Log each artifact as it is published; return once `issues` have one and no more is
    pending than the issues still to do."""
    while True:
        for issue, built in await asyncio.to_thread(_published, artifacts, set(completed)):
            completed[issue] = built["consumer"]
            logger.info(
                "%s completed %s (%s, attempt %d)",
                built["consumer"],
                issue,
                built["entryId"],
                built["attempt"],
            )
        if len(completed) >= issues and await _pending(redis) == len(ISSUES) - len(completed):
            return
        await asyncio.sleep(0.1)


def _published(artifacts: Path, seen: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """Artifacts published since `seen`: (issue, content), in issue order."""
    paths = sorted(path for path in artifacts.glob("*.json") if path.stem not in seen)
    return [(path.stem, json.loads(path.read_text())) for path in paths]


async def _pending(redis: AnyRedis) -> int:
    with contextlib.suppress(Exception):  # no group yet
        summary = await redis.xpending(STREAM, GROUP)
        return int(summary["pending"])
    return -1
