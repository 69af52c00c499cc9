"""A bounded registry: agents and consumers not heard from for RIG_AGENT_FORGET_MS leave it.
The active reaper's real scans delete their heartbeat rows (never a dry run); the event log
keeps every heartbeat; agents named in RIG_AGENT_IDS stay listed; a consumer still holding
entries keeps the rows that make it down (rule 3). Metric series go on every replica."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.app import create_app
from rig_conductor.metrics import Metrics
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.settings import Settings

from .helpers import fill, heartbeats_stored, read

S, G = "rig:dispatch", "workers"
TOKEN = "registry-test-token"
DOWN_MS = FORGET_MS = 60_000
EVERYONE = ("old-e", "new-e", "dev-e", "held-e")


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        streams=(S,),
        dispatch_stream=S,
        agent_ids=("dev-e",),
        agent_down_ms=DOWN_MS,
        agent_forget_ms=FORGET_MS,
        entry_stale_ms=0,
        api_tokens=TOKEN,
    )
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://c", headers=headers
        ) as c:
            yield c


async def beat(client: httpx.AsyncClient, agent: str, consumer: str) -> None:
    event = {"type": "HEARTBEAT", "agentId": agent, "consumer": consumer}
    assert (await client.post("/api/events", json=event)).status_code == 202


async def silence(engine: AsyncEngine, *agents: str) -> None:
    """Make the agents' rows, and their consumers', two minutes old (past the forget time)."""
    async with engine.begin() as conn:
        for table in ("agent_heartbeats", "consumer_heartbeats"):
            await conn.execute(
                text(
                    f"UPDATE {table} SET last_heartbeat_at = now() - interval '2 minutes' "
                    "WHERE agent_id = ANY(:agents)"
                ),
                {"agents": list(agents)},
            )


async def rows(engine: AsyncEngine) -> tuple[set[str], set[str], int]:
    async with engine.connect() as conn:
        agents = set((await conn.execute(text("SELECT agent_id FROM agent_heartbeats"))).scalars())
        consumers = set(
            (await conn.execute(text("SELECT consumer FROM consumer_heartbeats"))).scalars()
        )
    return agents, consumers, await heartbeats_stored(engine)


async def test_real_scans_forget_the_silent_and_keep_what_still_judges(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    for agent in EVERYONE:
        await beat(client, agent, f"{agent}-0")
    await silence(engine, "old-e", "dev-e", "held-e")
    # held-e-0 holds entries and no other consumer can take them: they stay where they are.
    await fill(redis, S, G, 2)
    await read(redis, S, G, "held-e-0", 2)
    everything = (set(EVERYONE), {f"{a}-0" for a in EVERYONE}, 4)

    assert (await client.post("/api/reaper/scan?dryRun=true")).status_code == 200
    assert await rows(engine) == everything  # a dry run forgets nothing

    report = (await client.post("/api/reaper/scan?dryRun=false")).json()
    assert report["noTarget"] == 2  # held-e-0 is still down: its own row and its agent's stay
    assert await rows(engine) == ({"new-e", "dev-e", "held-e"}, {"new-e-0", "held-e-0"}, 4)

    listed = {a["agentId"]: a for a in (await client.get("/api/agents")).json()}
    assert set(listed) == {"dev-e", "held-e", "new-e"}
    assert listed["dev-e"]["down"] and listed["dev-e"]["consumers"] == []
    assert (await client.get("/api/agents/old-e")).status_code == 404

    # Once its entries are gone, held-e-0 and held-e go too.
    await redis.xack(S, G, *[e for e, _ in (await redis.xrange(S))])
    await client.post("/api/reaper/scan?dryRun=false")
    assert await rows(engine) == ({"new-e", "dev-e"}, {"new-e-0"}, 4)


async def test_a_forgotten_agent_heard_again_is_back(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await beat(client, "old-e", "old-e-0")
    await silence(engine, "old-e")
    await client.post("/api/reaper/scan?dryRun=false")
    assert "old-e" not in {a["agentId"] for a in (await client.get("/api/agents")).json()}
    await beat(client, "old-e", "old-e-1")
    (again,) = [a for a in (await client.get("/api/agents")).json() if a["agentId"] == "old-e"]
    assert not again["down"] and again["consumers"] == ["old-e-1"]


async def test_the_metric_series_of_forgotten_agents_go(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await beat(client, "old-e", "old-e-0")
    await beat(client, "new-e", "new-e-0")
    await client.post("/api/reaper/scan?dryRun=false")
    assert 'rig_agent_up{agent="old-e"} 1.0' in (await client.get("/metrics")).text
    await silence(engine, "old-e")
    await client.post("/api/reaper/scan?dryRun=false")  # forgets the rows
    await client.post("/api/reaper/scan?dryRun=false")  # reads a registry without old-e
    exposed = (await client.get("/metrics")).text
    assert 'agent="old-e"' not in exposed
    assert 'rig_agent_up{agent="new-e"} 1.0' in exposed
    assert 'rig_agent_up{agent="dev-e"} 0.0' in exposed  # configured: listed, down


class _Follower:
    """An elector that never leads: the replica's scheduled scans are skipped."""

    identity = "follower"
    is_leader = False
    trouble = None

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


async def test_a_replica_that_does_not_reap_drops_series_too(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    settings = make_settings(streams=(S,), agent_down_ms=DOWN_MS, agent_forget_ms=FORGET_MS)
    metrics = Metrics()
    metrics.heartbeats_stored(["old-e"], at=0)  # heard on this replica long ago
    metrics.heartbeats_stored(["new-e"])
    follower: Any = _Follower()
    service = ReaperService(
        redis=redis, engine=engine, settings=settings, metrics=metrics, elector=follower
    )
    await service._scan_on_schedule()
    exposed = metrics.registry.get_sample_value
    assert exposed("rig_agent_up", {"agent": "old-e"}) is None
    assert exposed("rig_agent_up", {"agent": "new-e"}) == 1
    assert service.last_report is None  # it did not scan
