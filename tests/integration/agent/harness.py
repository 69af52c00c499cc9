"""The in-process agent runtime for the runtime's integration tests, and the lookups they
share (the conductor and agent settings fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, events
from rig_conductor.agent import Entry, run_agent
from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.runtime import SHUTDOWN_GRACE_S, Agent
from rig_conductor.agent.settings import AgentSettings

S, G = "rig:dispatch", "builders"
AGENT = "dev-e"
ME = "dev-e-agent-0"


def agent_of(
    handler: Callable[[Entry], Any],
    settings: AgentSettings,
    *,
    redis: Redis,
    conductor: ConductorClient,
    **options: Any,
) -> Agent:
    """An Agent (not started) reading S as ME of G for AGENT; `options` as Agent takes them."""
    return Agent(
        handler,
        settings=settings,
        agent_id=AGENT,
        group=G,
        stream=S,
        consumer=ME,
        redis=redis,
        conductor=conductor,
        **options,
    )


@contextlib.asynccontextmanager
async def running(
    handler: Callable[[Entry], Any], settings: AgentSettings, *, consumer: str = ME
) -> AsyncIterator[asyncio.Task[None]]:
    """run_agent in a task; stopped (gracefully) and awaited on exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_agent(
            handler,
            agent_id=AGENT,
            group=G,
            settings=settings,
            consumer=consumer,
            stop=stop,
            block_ms=100,
        )
    )
    try:
        yield task
    finally:
        stop.set()
        # Up to the runtime's own grace for the entry in hand, and some: a loaded machine is
        # slow, not wrong.
        await asyncio.wait_for(task, SHUTDOWN_GRACE_S + 15)


async def dispatch(conductor: str, issue: str) -> str:
    async with httpx.AsyncClient(base_url=conductor) as api:
        answer = await api.post(
            "/api/events",
            json={"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": AGENT, "payload": {}},
        )
        assert answer.status_code == 201, answer.text
        entry_id: str = answer.json()["entryId"]
        return entry_id


async def post(conductor: str, **event: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=conductor) as api:
        return await api.post("/api/events", json=event)


async def pending(redis: Redis, consumer: str | None = None) -> dict[str, int]:
    """entry id -> delivery count, for the group's (or one consumer's) pending list."""
    rows = await redis.xpending_range(S, G, min="-", max="+", count=1000, consumername=consumer)
    return {row["message_id"]: row["times_delivered"] for row in rows}


async def heard_from(conductor: str, consumer: str) -> bool:
    async with httpx.AsyncClient(base_url=conductor) as api:
        agents = (await api.get("/api/agents")).json()
    return any(consumer in agent["consumers"] for agent in agents)


async def drained(redis: Redis) -> bool:
    return await pending(redis) == {}


async def assignment(engine: AsyncEngine, entry_id: str) -> tuple[str, int] | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(assignments.c.state, assignments.c.attempt).where(
                    assignments.c.entry_id == entry_id
                )
            )
        ).first()
    return (row.state, row.attempt) if row else None


async def work_events(
    engine: AsyncEngine, entry_id: str
) -> list[tuple[str, int | None, bool, Any]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(events.c.kind, events.c.attempt, events.c.fenced, events.c.detail)
            .where(events.c.entry_id == entry_id, events.c.kind.like("WORK_%"))
            .order_by(events.c.id)
        )
        return [(r.kind, r.attempt, r.fenced, r.detail) for r in rows]


async def published(engine: AsyncEngine, entry_id: str) -> bool | None:
    """Whether the entry's accepted outputs are published (None: no outputs were recorded)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(assignments.c.outputs, assignments.c.published_at).where(
                    assignments.c.entry_id == entry_id
                )
            )
        ).one()
    if row.outputs is None:
        return None if row.published_at is None else True
    return row.published_at is not None


async def group_exists(redis: Redis) -> None:
    with contextlib.suppress(Exception):
        await redis.xgroup_create(S, G, id="0", mkstream=True)


async def delivered_to_me(conductor: str, redis: Redis, issue: str) -> str:
    """Dispatch `issue` and read it as this runtime's consumer before the runtime starts: the
    runtime meets it in its pending list."""
    entry_id = await dispatch(conductor, issue)
    await group_exists(redis)
    await redis.xreadgroup(G, ME, {S: ">"}, count=1)
    return entry_id


OLD = "dev-e-old"


async def old_owner(redis: Redis, entry_id: str) -> dict[str, str]:
    """Hand `entry_id` to an earlier owner, a consumer since gone, and return the fields of its
    reports: only a consumer holding the entry may start it. `back_to_me` hands it back, as
    the reaper's reclaim does once that owner is down."""
    await redis.xclaim(S, G, OLD, 0, [entry_id], justid=True)
    return {"agentId": AGENT, "consumer": OLD, "stream": S, "entryId": entry_id}


async def back_to_me(redis: Redis, entry_id: str) -> None:
    await redis.xclaim(S, G, ME, 0, [entry_id], justid=True)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob(".*.tmp"))
