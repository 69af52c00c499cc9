"""GET /api/agents and GET /api/agents/{agentId} in pages: keyset order by agent id (consumer
name for one agent's consumers), configured agents never heard from in their place, at most
the 10 freshest consumers per agent with the total beside them, and the console's Agents page
following the same pages."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings

from .console_kit import AGENT, VIEWER, builder, client_of, sign_in

BEARER = {"Authorization": f"Bearer {AGENT}"}
CONFIGURED = ("b-e", "d-e")


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = builder(make_settings)(agent_ids=CONFIGURED)
    async for c in client_of(app):
        yield c


async def beat(client: httpx.AsyncClient, agent: str, consumer: str | None = None) -> None:
    event = {"type": "HEARTBEAT", "agentId": agent, "consumer": consumer or f"{agent}-0"}
    assert (await client.post("/api/events", json=event, headers=BEARER)).status_code == 202


async def get(client: httpx.AsyncClient, path: str) -> httpx.Response:
    answer = await client.get(path, headers=BEARER)
    assert answer.status_code == 200, answer.text
    return answer


def next_link(answer: httpx.Response) -> str | None:
    found = re.fullmatch(r'<(\?[^>]*)>; rel="next"', answer.headers.get("link", ""))
    return found.group(1) if found else None


async def test_pages_follow_the_agent_ids_with_the_configured_ones_in_place(
    client: httpx.AsyncClient,
) -> None:
    for agent in ("e-e", "a-e", "c-e"):
        await beat(client, agent)
    pages, path = [], "/api/agents?limit=2"
    while path:
        answer = await get(client, path)
        pages.append([a["agentId"] for a in answer.json()])
        link = next_link(answer)
        path = f"/api/agents{link}" if link else ""
    assert pages == [["a-e", "b-e"], ["c-e", "d-e"], ["e-e"]]
    (never,) = (await get(client, "/api/agents?after=a-e&limit=1")).json()
    assert never == {
        "agentId": "b-e",
        "lastHeartbeatAt": None,
        "heartbeatAgeMs": None,
        "down": True,
        "degraded": False,
        "degradedReasons": [],
        "consumers": [],
        "consumerCount": 0,
    }
    assert (await get(client, "/api/agents?after=e-e")).json() == []


async def test_an_agent_lists_its_ten_freshest_consumers_and_counts_them_all(
    client: httpx.AsyncClient,
) -> None:
    names = [f"a-e-{n:02}" for n in range(12)]
    for name in names:  # each later than the one before: the last is the freshest
        await beat(client, "a-e", name)
    (listed,) = (await get(client, "/api/agents?limit=1")).json()
    assert listed["consumers"] == names[::-1][:10]
    assert listed["consumerCount"] == 12
    await beat(client, "a-e", names[0])  # heard again: first in the list
    (listed,) = (await get(client, "/api/agents?limit=1")).json()
    assert listed["consumers"][0] == names[0]


async def test_one_agent_pages_all_its_consumers_by_name(client: httpx.AsyncClient) -> None:
    names = [f"a-e-{n:02}" for n in range(12)]
    for name in reversed(names):
        await beat(client, "a-e", name)
    seen, path = [], "/api/agents/a-e?limit=5"
    while path:
        answer = await get(client, path)
        agent = answer.json()
        assert agent["agentId"] == "a-e" and agent["consumerCount"] == 12
        seen.append(agent["consumers"])
        link = next_link(answer)
        path = f"/api/agents/a-e{link}" if link else ""
    assert seen == [names[:5], names[5:10], names[10:]]
    configured = (await get(client, "/api/agents/d-e")).json()
    assert configured["down"] and configured["consumers"] == []
    missing = await client.get("/api/agents/nobody", headers=BEARER)
    assert missing.status_code == 404


@pytest.mark.parametrize("query", ["limit=0", "limit=1001", "limit=many", "after="])
async def test_bad_paging_parameters_answer_422_naming_them(
    client: httpx.AsyncClient, query: str
) -> None:
    for path in ("/api/agents", "/api/agents/a-e"):
        answer = await client.get(f"{path}?{query}", headers=BEARER)
        assert answer.status_code == 422, answer.text
        assert answer.json()["errors"][0]["field"] == f"query.{query.split('=')[0]}"


async def test_the_agents_page_pages(client: httpx.AsyncClient) -> None:
    for agent in ("e-e", "a-e", "c-e"):
        await beat(client, agent)
    await sign_in(client, VIEWER)
    shown, path = [], "/ui/agents?limit=2"
    while path:
        page = (await client.get(path)).text
        shown.append(re.findall(r'<tr class="\w+">\s*<td>([^<]+)</td>', page))
        found = re.search(r'<a href="([^"]+)" id="next">', page)
        path = found.group(1).replace("&amp;", "&") if found else ""
    assert shown == [["a-e", "b-e"], ["c-e", "d-e"], ["e-e"]]
