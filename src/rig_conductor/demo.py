"""`rig-conductor demo`: the whole story on embedded Redis and PostgreSQL, in under a minute.

Two simulated agents read `rig:dispatch` in one consumer group. `builder-b` takes four issues
and dies without acking them; `builder-a` keeps heartbeating and working. The reaper, on short
demo thresholds, sees builder-b go silent, reclaims its entries to builder-a, and builder-a
finishes them. Runs until every issue is done (or the timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres import migrations, queries
from rig_conductor.domain import AgentId, ConsumerName, StreamKey
from rig_conductor.embedded import EmbeddedUnavailable, embedded_services
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

STREAM = StreamKey("rig:dispatch")
GROUP = "builders"
LIVE = (AgentId("builder-a"), ConsumerName("builder-a-rig-agent-runtime-0"))
DOOMED = (AgentId("builder-b"), ConsumerName("builder-b-rig-agent-runtime-0"))
ISSUES = [f"rc-{n}" for n in range(101, 107)]


def run(*, timeout_s: float, log_format: str) -> int:
    try:
        with embedded_services() as services:
            settings = Settings(
                redis_url=services.redis_url,
                database_url=services.database_url,
                streams=(STREAM,),
                agent_ids=(LIVE[0], DOOMED[0]),
                entry_stale_ms=2_000,
                agent_down_ms=3_000,
                scan_interval_s=1.0,
                startup_delay_s=0.0,
                log_format=log_format,
            )
            migrations.upgrade(settings.sqlalchemy_url)
            return asyncio.run(_run(settings, timeout_s))
    except EmbeddedUnavailable as exc:
        logger.error("%s", exc)
        return 2


async def _run(settings: Settings, timeout_s: float) -> int:
    redis = redis_streams.connect(settings.redis_url)
    engine = pg.create_engine(settings.sqlalchemy_url, pool_size=3)
    completed: dict[str, str] = {}
    all_done, stop = asyncio.Event(), asyncio.Event()
    try:
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        for issue in ISSUES:
            await _dispatch(redis, issue)
        await _heartbeat(engine, settings, *DOOMED)
        await _crash_after_reading(redis, DOOMED[1], count=4)
        live = asyncio.create_task(_live_agent(redis, engine, settings, completed, all_done, stop))
        reaper = asyncio.create_task(_reaper(redis, engine, settings, stop))
        try:
            async with asyncio.timeout(timeout_s):
                await all_done.wait()
        except TimeoutError:
            logger.error("Demo timed out: %d of %d issues done", len(completed), len(ISSUES))
            return 1
        finally:
            # Loops finish their current step: cancelling one mid-query would strand a connection.
            stop.set()
            await asyncio.gather(live, reaper)
        reclaims = await queries.count_events(engine, tenant=settings.tenant, kind="RECLAIMED")
        logger.info(
            "Demo done: %d issues completed, %d reclaimed from %s. Completed by: %s",
            len(completed),
            reclaims,
            DOOMED[1],
            json.dumps(completed, sort_keys=True),
        )
        return 0
    finally:
        await redis.aclose()
        await engine.dispose()


async def _dispatch(redis: Redis, issue: str) -> None:
    fields: dict[Any, Any] = {
        "type": "ISSUE_ASSIGNED",
        "issueId": issue,
        "agentId": "builder",
        "payload": json.dumps({"title": f"Build {issue}"}),
        "assignedAt": datetime.now(UTC).isoformat(),
    }
    entry = await redis.xadd(STREAM, fields)
    logger.info("Dispatched %s as %s", issue, entry)


async def _heartbeat(
    engine: AsyncEngine, settings: Settings, agent: AgentId, consumer: ConsumerName
) -> None:
    await queries.record_heartbeats(
        engine, tenant=settings.tenant, heartbeats=[queries.HeartbeatIn(agent, consumer)]
    )


async def _crash_after_reading(redis: Redis, consumer: ConsumerName, count: int) -> None:
    taken = await redis.xreadgroup(GROUP, consumer, {STREAM: ">"}, count=count)
    ids = [entry_id for entry_id, _ in _entries(taken)]
    logger.warning("%s read %s and crashed before acking them", consumer, ", ".join(ids))


async def _live_agent(
    redis: Redis,
    engine: AsyncEngine,
    settings: Settings,
    completed: dict[str, str],
    all_done: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    agent, consumer = LIVE
    while not stop.is_set():
        await _heartbeat(engine, settings, agent, consumer)
        # Its own pending list first: that is where reclaimed entries land.
        for start in ("0", ">"):
            try:
                batches = await redis.xreadgroup(GROUP, consumer, {STREAM: start}, count=10)
            except ResponseError as exc:
                logger.error("%s could not read: %s", consumer, exc)
                continue
            for entry_id, fields in _entries(batches):
                await asyncio.sleep(0.1)  # the work
                await redis.xack(STREAM, GROUP, entry_id)
                completed[fields.get("issueId", entry_id)] = consumer
                logger.info("%s completed %s (%s)", consumer, fields.get("issueId"), entry_id)
                if len(completed) == len(ISSUES):
                    all_done.set()
        await _pause(stop, 0.5)


async def _reaper(
    redis: Redis, engine: AsyncEngine, settings: Settings, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            report = await cycle.reap_once(redis=redis, engine=engine, settings=settings)
        except Exception as exc:
            logger.error("Scan failed: %s", cycle.describe_failure(exc))
        else:
            if report.reclaimed or report.dead_lettered:
                logger.info("Scan report: %s", json.dumps(report.to_json()))
        await _pause(stop, settings.scan_interval_s)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, but wake at once when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """The (id, fields) pairs of an XREADGROUP reply for one stream."""
    return [(entry_id, fields) for _, entries in reply or [] for entry_id, fields in entries]
