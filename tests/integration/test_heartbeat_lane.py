"""The heartbeat's own lane (`api.heartbeat_lane`) answers as the route does, and hands every
other request on to FastAPI with its body intact.

PostgreSQL's outage through the lane (503 with Retry-After) is in
`postgres_faults/test_postgres_outage.py`; bound tokens through it in `test_bound_tokens.py`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .console_kit import client_of
from .helpers import heartbeats_stored

BEAT = {"type": "HEARTBEAT", "agentId": "dev-e", "consumer": "dev-e-0"}


def _app(make_settings: Callable[..., Settings]) -> FastAPI:
    settings = make_settings(agent_ids=("dev-e",), streams=("rig:dispatch",))
    return create_app(settings, schedule_reaper=False)


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 7):
        yield body[start : start + 7]


async def test_a_heartbeat_in_many_chunks_is_stored_once(
    make_settings: Callable[..., Settings], engine: AsyncEngine
) -> None:
    async for api in client_of(_app(make_settings)):
        answer = await api.post(
            "/api/events",
            content=_chunks(json.dumps(BEAT).encode()),
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert (answer.status_code, answer.json()) == (202, {"accepted": True})
        assert answer.headers["content-type"] == "application/json"
        assert await heartbeats_stored(engine) == 1
        agents = (await api.get("/api/agents")).json()
        assert [(a["agentId"], a["consumers"]) for a in agents] == [("dev-e", ["dev-e-0"])]


async def test_an_invalid_heartbeat_gets_fastapis_422_naming_the_field(
    make_settings: Callable[..., Settings], engine: AsyncEngine
) -> None:
    async for api in client_of(_app(make_settings)):
        for body, field in (
            ({**BEAT, "degraded": "yes"}, "degraded"),
            ({**BEAT, "agentId": "dev\ne"}, "agentId"),
            ({"type": "HEARTBEAT"}, "agentId"),
        ):
            answer = await api.post("/api/events", json=body)
            assert answer.status_code == 422, answer.text
            assert answer.json()["errors"][0]["field"] == field, answer.text
        broken = await api.post(
            "/api/events",
            content=b'{"type": "HEARTBEAT", "agentId": ',
            headers={"Content-Type": "application/json"},
        )
        assert (broken.status_code, broken.json()["errors"][0]["type"]) == (422, "json_invalid")
        assert await heartbeats_stored(engine) == 0


async def test_a_heartbeat_that_is_not_json_by_its_content_type_is_refused(
    make_settings: Callable[..., Settings], engine: AsyncEngine
) -> None:
    async for api in client_of(_app(make_settings)):
        answer = await api.post(
            "/api/events", content=json.dumps(BEAT), headers={"Content-Type": "text/plain"}
        )
        assert answer.status_code == 422
        assert answer.json()["errors"][0]["type"] == "content_type", answer.text
        assert await heartbeats_stored(engine) == 0


async def test_other_events_reach_the_route_with_their_body(
    make_settings: Callable[..., Settings], redis: Redis
) -> None:
    async for api in client_of(_app(make_settings)):
        dispatch = {"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev-e"}
        answer = await api.post(
            "/api/events",
            content=_chunks(json.dumps(dispatch).encode()),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 201, answer.text
        (entry,) = await redis.xrange("rig:dispatch")
        assert entry[0] == answer.json()["entryId"]
        # A body naming HEARTBEAT that is another event still reaches its own rules.
        mentions = {**dispatch, "issueId": "HEARTBEAT"}
        assert (await api.post("/api/events", json=mentions)).status_code == 201
