"""Work is owned per group: groups reading one stream each get their own attempts and finish on
their own, a group an agent made for itself cancels nothing, and an agent of the previous
release (no `group`) is taken for the one group it works in. Real Redis, real PostgreSQL, the
conductor's app over ASGI."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .helpers import read

S = "rig:dispatch"
WORKERS, AUDITORS, ROGUE = "workers", "auditors", "rogue"


@pytest.fixture
async def api(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        streams=(S,), dispatch_stream=S, agent_ids=("dev-e", "qa-e"), entry_stale_ms=0
    )
    app: FastAPI = create_app(settings, schedule_reaper=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
            yield client


def work(
    kind: str, consumer: str, entry: str, group: str | None, attempt: int | None = None
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": kind,
        "agentId": consumer.rsplit("-", 1)[0],
        "consumer": consumer,
        "stream": S,
        "entryId": entry,
    }
    if group is not None:
        event["group"] = group
    if attempt is not None:
        event["attempt"] = attempt
    return event


async def dispatched(api: httpx.AsyncClient, issue: str) -> str:
    event = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "dev-e"}
    answer = await api.post("/api/events", json=event)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["entryId"])


async def reads(redis: Redis, group: str, consumer: str) -> None:
    with contextlib.suppress(ResponseError):  # BUSYGROUP
        await redis.xgroup_create(S, group, id="0")
    await read(redis, S, group, consumer, 10)


async def post(api: httpx.AsyncClient, event: dict[str, Any]) -> httpx.Response:
    return await api.post("/api/events", json=event)


async def test_a_group_an_agent_made_for_itself_cancels_nothing(
    api: httpx.AsyncClient, redis: Redis
) -> None:
    """dev-e makes a group of its own on the dispatch stream, reads everything and reports it
    done. qa-e's real work in `workers` is still its to start and to finish."""
    entry = await dispatched(api, "rc-1")
    await reads(redis, WORKERS, "qa-e-0")
    await reads(redis, ROGUE, "dev-e-0")
    started = await post(api, work("WORK_STARTED", "dev-e-0", entry, ROGUE))
    assert started.status_code == 202 and started.json() == {"attempt": 1}
    done = await post(api, work("WORK_COMPLETED", "dev-e-0", entry, ROGUE, 1))
    assert done.status_code == 202

    real = await post(api, work("WORK_STARTED", "qa-e-0", entry, WORKERS))
    assert real.status_code == 202 and real.json() == {"attempt": 1}, real.text
    finished = await post(api, work("WORK_COMPLETED", "qa-e-0", entry, WORKERS, 1))
    assert finished.status_code == 202 and finished.json()["state"] == "done", finished.text
    # And the rogue group's consumer may not report on the real group's attempt.
    forged = await post(api, work("WORK_COMPLETED", "dev-e-0", entry, WORKERS, 1))
    assert forged.status_code == 409


async def test_two_groups_fanning_out_each_work_and_finish_on_their_own(
    api: httpx.AsyncClient, redis: Redis
) -> None:
    entry = await dispatched(api, "rc-2")
    await reads(redis, WORKERS, "qa-e-0")
    await reads(redis, AUDITORS, "dev-e-0")
    for group, consumer in ((WORKERS, "qa-e-0"), (AUDITORS, "dev-e-0")):
        started = await post(api, work("WORK_STARTED", consumer, entry, group))
        assert started.json() == {"attempt": 1}, (group, started.text)
    # A second start in `workers` fences the first there, and only there.
    again = await post(api, work("WORK_STARTED", "qa-e-0", entry, WORKERS))
    assert again.json() == {"attempt": 2}
    stale = await post(api, work("WORK_COMPLETED", "qa-e-0", entry, WORKERS, 1))
    assert stale.status_code == 409 and stale.json()["detail"].startswith("fenced:")
    audited = await post(api, work("WORK_COMPLETED", "dev-e-0", entry, AUDITORS, 1))
    assert audited.status_code == 202 and audited.json()["state"] == "done"
    worked = await post(api, work("WORK_COMPLETED", "qa-e-0", entry, WORKERS, 2))
    assert worked.status_code == 202 and worked.json()["state"] == "done"


async def test_an_event_of_the_previous_release_is_taken_for_its_one_group(
    api: httpx.AsyncClient, redis: Redis
) -> None:
    entry = await dispatched(api, "rc-3")
    await reads(redis, WORKERS, "qa-e-0")
    await reads(redis, AUDITORS, "dev-e-0")
    legacy = await post(api, work("WORK_STARTED", "qa-e-0", entry, None))
    assert legacy.status_code == 202 and legacy.json() == {"attempt": 1}
    done = await post(api, work("WORK_COMPLETED", "qa-e-0", entry, None, 1))
    assert done.status_code == 202 and done.json()["state"] == "done"
    # It was qa-e-0's work in `workers`: `auditors` still has its own attempt 1 to make.
    audit = await post(api, work("WORK_STARTED", "dev-e-0", entry, AUDITORS))
    assert audit.json() == {"attempt": 1}
    metrics = (await api.get("/metrics")).text
    assert 'rig_legacy_events_total{type="WORK_STARTED"} 1.0' in metrics
    assert 'rig_legacy_events_total{type="WORK_COMPLETED"} 1.0' in metrics


async def test_an_event_without_group_held_in_two_groups_names_group(
    api: httpx.AsyncClient, redis: Redis
) -> None:
    entry = await dispatched(api, "rc-4")
    await reads(redis, WORKERS, "dev-e-0")
    await reads(redis, AUDITORS, "dev-e-0")
    both = await post(api, work("WORK_STARTED", "dev-e-0", entry, None))
    assert both.status_code == 422 and both.json()["detail"].startswith("group:"), both.text
