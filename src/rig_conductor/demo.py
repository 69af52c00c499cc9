"""`rig-conductor demo`: the whole story on embedded Redis and PostgreSQL, in under a minute.

The conductor runs for real: the HTTP API under uvicorn with its scheduled reaper. Six issues
are dispatched through `POST /api/events`. Two simulated agents read `rig:dispatch` in one
consumer group and heartbeat over HTTP. `builder-b` takes four issues and dies without acking
them; `builder-a` keeps working. On short demo thresholds the reaper sees builder-b go silent,
reclaims its entries to builder-a, and builder-a finishes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Any

import httpx
import uvicorn
from redis.asyncio import Redis

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import migrations
from rig_conductor.app import create_app
from rig_conductor.embedded import EmbeddedUnavailable, embedded_services
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

STREAM = "rig:dispatch"
GROUP = "builders"
LIVE = ("builder-a", "builder-a-rig-agent-runtime-0")
DOOMED = ("builder-b", "builder-b-rig-agent-runtime-0")
ISSUES = [f"rc-{n}" for n in range(101, 107)]
PREFERRED_PORT = 8080


def run(*, timeout_s: float, log_format: str, keep_running: bool = False) -> int:
    try:
        with embedded_services() as services:
            settings = Settings(
                redis_url=services.redis_url,
                database_url=services.database_url,
                http_host="127.0.0.1",
                http_port=_port(),
                streams=(STREAM,),
                agent_ids=(LIVE[0], DOOMED[0]),
                entry_stale_ms=2_000,
                agent_down_ms=3_000,
                scan_interval_s=1.0,
                startup_delay_s=0.0,
                log_format=log_format,
            )
            migrations.upgrade(settings.sqlalchemy_url)
            return asyncio.run(_run(settings, timeout_s, keep_running))
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


async def _run(settings: Settings, timeout_s: float, keep_running: bool) -> int:
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
    redis = redis_streams.connect(settings.redis_url)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as api:
            done = await _story(api, redis, timeout_s)
        if done and keep_running:
            logger.info("Demo done; the conductor keeps serving at %s until Ctrl-C", url)
            await serving
    finally:
        await redis.aclose()
        server.should_exit = True
        await serving
    return 0 if done else 1


async def _story(api: httpx.AsyncClient, redis: Redis, timeout_s: float) -> bool:
    await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    for issue in ISSUES:
        answer = await _post(
            api,
            type="ISSUE_ASSIGNED",
            issueId=issue,
            agentId="builder",
            payload={"title": f"Build {issue}"},
        )
        logger.info("Dispatched %s as %s", issue, answer["entryId"])
    await _post(api, type="HEARTBEAT", agentId=DOOMED[0], consumer=DOOMED[1])
    await _crash_after_reading(redis, DOOMED[1], count=4)
    completed: dict[str, str] = {}
    stop = asyncio.Event()
    worker = asyncio.create_task(_live_agent(api, redis, completed, stop))
    try:
        async with asyncio.timeout(timeout_s):
            await stop.wait()
    except TimeoutError:
        logger.error("Demo timed out: %d of %d issues done", len(completed), len(ISSUES))
        return False
    finally:
        stop.set()
        await worker  # it finishes its current step: no request is cut off mid-way
    streams = (await api.get("/api/streams")).json()
    logger.info(
        "Demo done: %d issues completed, all by %s. Pending now: %s",
        len(completed),
        ", ".join(sorted(set(completed.values()))),
        json.dumps({g["group"]: g["pending"] for g in streams}),
    )
    return True


async def _post(api: httpx.AsyncClient, **event: Any) -> dict[str, Any]:
    answer = await api.post("/api/events", json=event)
    answer.raise_for_status()
    body: dict[str, Any] = answer.json()
    return body


async def _crash_after_reading(redis: Redis, consumer: str, count: int) -> None:
    taken = await redis.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=count)
    ids = [entry_id for entry_id, _ in _entries(taken)]
    logger.warning("%s read %s and crashed before acking them", consumer, ", ".join(ids))


async def _live_agent(
    api: httpx.AsyncClient, redis: Redis, completed: dict[str, str], stop: asyncio.Event
) -> None:
    agent, consumer = LIVE
    await redis.xgroup_createconsumer(STREAM, GROUP, consumer)
    while not stop.is_set():
        await _post(api, type="HEARTBEAT", agentId=agent, consumer=consumer)
        # Its own pending list first: that is where reclaimed entries land.
        for start in ("0", ">"):
            batch = await redis.xreadgroup(GROUP, consumer, {STREAM: start}, count=10)
            for entry_id, fields in _entries(batch):
                report = {
                    "agentId": agent,
                    "consumer": consumer,
                    "stream": STREAM,
                    "entryId": entry_id,
                    "issueId": fields.get("issueId"),
                }
                started = await _post(api, type="WORK_STARTED", **report)
                await asyncio.sleep(0.1)  # the work
                await _post(api, type="WORK_COMPLETED", attempt=started["attempt"], **report)
                await redis.xack(STREAM, GROUP, entry_id)
                completed[fields.get("issueId", entry_id)] = consumer
                logger.info("%s completed %s (%s)", consumer, fields.get("issueId"), entry_id)
        if len(completed) == len(ISSUES):
            stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The (id, fields) pairs of an XREADGROUP reply for one stream."""
    return [(entry_id, fields) for _, entries in reply or [] for entry_id, fields in entries]
