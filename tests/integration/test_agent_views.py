"""Agents up, down and degraded: one read model (`operations.views.agents`, on the reaper's
`Fleet`) behind GET /api/agents, the console's Agents page and the overview's tiles, so the
three never disagree."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.operations import views
from rig_conductor.policy import measure
from rig_conductor.settings import Settings

from .console_kit import AGENT, VIEWER, builder, client_of, sign_in

BEARER = {"Authorization": f"Bearer {AGENT}"}


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = builder(make_settings)(agent_ids=("up-e", "sick-e", "gone-e", "never-e"))
    async for c in client_of(app):
        yield c


async def beat(client: httpx.AsyncClient, agent: str, **extra: object) -> None:
    event = {"type": "HEARTBEAT", "agentId": agent, "consumer": f"{agent}-0", **extra}
    assert (await client.post("/api/events", json=event, headers=BEARER)).status_code == 202


def page_states(html: str) -> dict[str, str]:
    rows = re.findall(r'<tr class="(\w+)">\s*<td>([^<]+)</td>', html)
    return {agent: state for state, agent in rows}


def tiles(html: str) -> dict[str, int]:
    found = re.findall(
        r'<span class="n">(\d+)</span><span class="l">(agents up|down|degraded)<', html
    )
    return {label.removeprefix("agents "): int(n) for n, label in found}


async def test_the_api_the_agents_page_and_the_overview_agree(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    await beat(client, "up-e")
    await beat(client, "sick-e", degraded=True, degradedReasons=["quota"])
    await beat(client, "gone-e")
    async with engine.begin() as conn:  # gone-e's last heartbeat: an hour ago (down at 10 min)
        await conn.execute(
            text(
                "UPDATE agent_heartbeats SET last_heartbeat_at = now() - interval '1 hour' "
                "WHERE agent_id = 'gone-e'"
            )
        )
    want = {"up-e": "up", "sick-e": "degraded", "gone-e": "down", "never-e": "down"}
    api = {
        a["agentId"]: "down" if a["down"] else ("degraded" if a["degraded"] else "up")
        for a in (await client.get("/api/agents", headers=BEARER)).json()
    }
    assert api == want
    await sign_in(client, VIEWER)
    assert page_states((await client.get("/ui/agents")).text) == want
    assert tiles((await client.get("/ui")).text) == {"up": 1, "down": 2, "degraded": 1}
    page = (await client.get("/ui/agents")).text
    assert "quota" in page and "never" in page and "up-e-0" in page


async def test_all_three_read_the_one_read_model(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API and the Agents page show `views.agents`' rows; the overview's tiles count the
    registry, as the last scan measured it, with the same judgement (`measure.agent_state`),
    without listing it."""
    judged = [
        views.AgentRow("a-e", datetime.now(UTC), 5, False, False, (), ("a-e-0",), 1),
        views.AgentRow("b-e", None, None, True, False, (), ()),
        views.AgentRow("c-e", datetime.now(UTC), 7, False, True, ("disk",), ()),
    ]

    async def fixed(rt: object, **_: object) -> list[views.AgentRow]:
        return judged

    monkeypatch.setattr(views, "agents", fixed)
    api = (await client.get("/api/agents", headers=BEARER)).json()
    assert [(a["agentId"], a["down"], a["degraded"]) for a in api] == [
        ("a-e", False, False),
        ("b-e", True, False),
        ("c-e", False, True),
    ]
    await sign_in(client, VIEWER)
    want = {"a-e": "up", "b-e": "down", "c-e": "degraded"}
    assert page_states((await client.get("/ui/agents")).text) == want
    assert tiles((await client.get("/ui")).text) == {"up": 0, "down": 4, "degraded": 0}
    monkeypatch.setattr(measure, "agent_state", lambda **_: "degraded")
    assert set(page_states((await client.get("/ui/agents")).text).values()) == {"degraded"}
    scan = await client.post("/api/reaper/scan", params={"dryRun": "true"}, headers=BEARER)
    assert scan.status_code == 200, scan.text
    assert tiles((await client.get("/ui")).text) == {"up": 0, "down": 0, "degraded": 4}
