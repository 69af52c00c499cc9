"""RIG_API_TOKEN_FILE end to end: an agent whose projected token the kubelet rotates keeps
talking to a real conductor that takes only the current token."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent import Entry
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.settings import Settings
from tests.projected_token import projected

from ..helpers import wait_for
from .conftest import conductor_settings, serving
from .harness import AGENT, ME, S, assignment, running

EXPIRED = "expired-projected-token-0001"
CURRENT = "current-projected-token-0002"


async def heard_from(api: httpx.AsyncClient, consumer: str) -> bool:
    agents = (await api.get("/api/agents")).json()
    return any(consumer in agent["consumers"] for agent in agents)


async def test_the_agent_follows_its_rotated_token_file(
    make_settings: Callable[..., Settings],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    tmp_path: Path,
) -> None:
    volume = tmp_path / "rig-token"
    path = projected(volume, EXPIRED + "\n", 1)  # the kubelet writes a trailing newline too
    handled: list[str] = []

    def handler(entry: Entry) -> None:
        handled.append(entry.fields["issueId"])

    async with serving(conductor_settings(make_settings, api_tokens=(CURRENT,))) as url:
        agent = AgentSettings(
            redis_url=redis_url,
            conductor_url=url,
            api_token_file=path,
            heartbeat_interval_s=0.2,
            dispatch_stream=S,
            max_deliveries=2,
        )
        headers = {"Authorization": f"Bearer {CURRENT}"}
        async with (
            httpx.AsyncClient(base_url=url, headers=headers) as api,
            running(handler, agent),
        ):
            await wait_for(lambda: redis.exists(S))  # started, heartbeating with a refused token
            assert not await heard_from(api, ME)

            projected(volume, CURRENT, 2)  # rotation: the path stays, the file behind it changes
            await wait_for(lambda: heard_from(api, ME))

            dispatched = await api.post(
                "/api/events",
                json={"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": AGENT},
            )
            assert dispatched.status_code == 201, dispatched.text
            entry_id = dispatched.json()["entryId"]
            await wait_for(lambda: _done(engine, entry_id))
    assert handled == ["rc-1"]


async def _done(engine: AsyncEngine, entry_id: str) -> bool:
    return await assignment(engine, entry_id) == ("done", 1)
