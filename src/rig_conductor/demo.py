"""`rig-conductor demo`: the whole story on embedded Redis and PostgreSQL, in about ten seconds.

The conductor runs for real: the HTTP API under uvicorn with its scheduled reaper. Six issues
are dispatched through `POST /api/events`. The agents run the real agent runtime (`run_agent`,
in-process), reading `rig:dispatch` in one consumer group and heartbeating over HTTP.
`builder-b` runs four workers; each takes an issue and hangs in its build, then builder-b's
node dies: the workers stop dead, nothing acked, no more heartbeats. `builder-a` builds the
other two issues. On short demo thresholds the reaper sees builder-b go silent and reclaims its
four entries to builder-a, which builds them as a new attempt (builder-b's attempts are fenced
off). Every build writes an artifact through `entry.stage()`, published only once the conductor
has accepted the completion; the demo reports who built each issue from those artifacts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import tempfile
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from rig_conductor.adapters import redis_client
from rig_conductor.adapters.postgres import migrations
from rig_conductor.adapters.redis_client import AnyRedis
from rig_conductor.agent import Entry, run_agent
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.app import create_app
from rig_conductor.embedded import EmbeddedUnavailable, embedded_services
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

STREAM = "rig:dispatch"
GROUP = "builders"
LIVE = ("builder-a", "builder-a-rig-agent-runtime-0")
DOOMED_AGENT = "builder-b"
DOOMED = tuple(f"{DOOMED_AGENT}-rig-agent-runtime-{n}" for n in range(4))
ISSUES = [f"rc-{n}" for n in range(101, 107)]
PREFERRED_PORT = 8080
BUILD_S = 0.1
BLOCK_MS = 250  # short blocking reads: builder-a stops promptly at the end
STOP_TIMEOUT_S = 10.0


# --watch: time to open the console before the story starts, and thresholds slow enough to
# see builder-b's consumers hold their entries, turn down, and lose them to builder-a.
WATCH_LEAD_S = 10.0
WATCH_AGENT_DOWN_MS = 10_000
WATCH_SCAN_INTERVAL_S = 5.0


def run(
    *, timeout_s: float, log_format: str, keep_running: bool = False, watch: bool = False
) -> int:
    try:
        with embedded_services() as services:
            settings = Settings(
                redis_url=services.redis_url,
                database_url=services.database_url,
                http_host="127.0.0.1",
                http_port=_port(),
                dispatch_stream=STREAM,
                streams=(STREAM,),
                agent_ids=(LIVE[0], DOOMED_AGENT),
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
            return asyncio.run(_run(settings, timeout_s + lead_s, keep_running or watch, lead_s))
    except EmbeddedUnavailable as exc:
        logger.error("%s", exc)
        return 2


def _port() -> int:
    """8080 when it is free, else any free port."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", PREFERRED_PORT))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _run(settings: Settings, timeout_s: float, keep_running: bool, lead_s: float) -> int:
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.http_host,
            port=settings.http_port,
            log_config=None,
            access_log=False,
        )
    )
    serving = asyncio.create_task(server.serve())
    # uvicorn exposes start-up as a flag, not an event.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    url = f"http://{settings.http_host}:{settings.http_port}"
    logger.info("Conductor serving at %s (try %s/api/streams)", url, url)
    logger.info("Console: %s/ui (open it to watch the reclaim live)", url)
    if lead_s:
        logger.info("The story starts in %.0f s", lead_s)
        await asyncio.sleep(lead_s)
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
    redis = redis_client.connect(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="rig-demo-") as scratch:
            async with httpx.AsyncClient(base_url=url, timeout=10) as api:
                done = await _story(api, redis, agents, Path(scratch), timeout_s)
        if done and keep_running:
            logger.info("Demo done; the conductor keeps serving at %s until Ctrl-C", url)
            await serving
    finally:
        await redis.aclose()
        server.should_exit = True
        await serving
    return 0 if done else 1


async def _story(
    api: httpx.AsyncClient,
    redis: AnyRedis,
    agents: AgentSettings,
    artifacts: Path,
    timeout_s: float,
) -> bool:
    completed: dict[str, str] = {}
    crew = _Crew(agents, artifacts)
    try:
        async with asyncio.timeout(timeout_s):
            for issue in ISSUES:
                entry_id = await _dispatch(api, issue)
                logger.info("Dispatched %s as %s", issue, entry_id)
            await crew.doomed_take_work()
            await crew.kill_doomed()
            crew.start_live()
            await _watch(artifacts, redis, completed)
    except TimeoutError:
        logger.error("Demo timed out: %d of %d issues done", len(completed), len(ISSUES))
        return False
    finally:
        await crew.stop()  # builder-a finishes its current step: nothing is cut off mid-way
    streams = (await api.get("/api/streams")).json()
    logger.info(
        "Demo done: %d issues completed, all by %s. Pending now: %s",
        len(completed),
        ", ".join(sorted(set(completed.values()))),
        json.dumps({g["group"]: g["pending"] for g in streams}),
    )
    return True


async def _dispatch(api: httpx.AsyncClient, issue: str) -> str:
    answer = await api.post(
        "/api/events",
        json={
            "type": "ISSUE_ASSIGNED",
            "issueId": issue,
            "agentId": "builder",
            "payload": {"title": f"Build {issue}"},
        },
    )
    answer.raise_for_status()
    entry_id: str = answer.json()["entryId"]
    return entry_id


class _Crew:
    """builder-b's four workers, which die mid-build, and builder-a, which survives."""

    def __init__(self, settings: AgentSettings, artifacts: Path) -> None:
        self.settings = settings
        self.artifacts = artifacts
        self.doomed: list[asyncio.Task[None]] = []
        self.building: dict[str, Entry] = {}
        self.all_building = asyncio.Event()
        self.live: asyncio.Task[None] | None = None
        self.live_stop = asyncio.Event()

    async def doomed_take_work(self) -> None:
        """Start builder-b's workers; return once each is stuck in the build of one issue."""
        for consumer in DOOMED:
            agent = run_agent(
                self._hang,
                agent_id=DOOMED_AGENT,
                group=GROUP,
                settings=self.settings,
                stream=STREAM,
                consumer=consumer,
                block_ms=BLOCK_MS,
            )
            self.doomed.append(asyncio.create_task(agent, name=consumer))
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

    def start_live(self) -> None:
        agent_id, consumer = LIVE
        agent = run_agent(
            self._build,
            agent_id=agent_id,
            group=GROUP,
            settings=self.settings,
            stream=STREAM,
            consumer=consumer,
            stop=self.live_stop,
            block_ms=BLOCK_MS,
        )
        self.live = asyncio.create_task(agent, name=consumer)

    async def _build(self, entry: Entry) -> None:
        await asyncio.sleep(BUILD_S)  # the work
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
        if self.live is None:
            return
        self.live_stop.set()
        try:
            await asyncio.wait_for(self.live, STOP_TIMEOUT_S)
        except TimeoutError:
            logger.warning("builder-a did not stop within %.0fs", STOP_TIMEOUT_S)
        except Exception as exc:
            logger.error("builder-a failed: %s: %s", type(exc).__name__, exc)


async def _watch(artifacts: Path, redis: AnyRedis, completed: dict[str, str]) -> None:
    """Log each artifact as it is published; return once every issue has one and nothing is
    pending any more."""
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
        if len(completed) == len(ISSUES) and await _pending(redis) == 0:
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
