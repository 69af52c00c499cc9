"""One piece of work's whole story (GET /api/work/{issueId} and
GET /api/streams/{stream}/entries/{entryId}): the event log's timeline, folded and paged,
beside where the entry stands in each group now."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings

from .console_kit import AGENT, OPERATOR, VIEWER, G, S, builder, client_of, heartbeat
from .helpers import read, register

AS_AGENT = {"Authorization": f"Bearer {AGENT}"}
AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}


@pytest.fixture
async def client(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    app: FastAPI = builder(make_settings)()
    async for c in client_of(app):
        yield c


async def event(client: httpx.AsyncClient, body: dict[str, Any], status: int = 202) -> Any:
    answer = await client.post("/api/events", json=body, headers=AS_AGENT)
    assert answer.status_code == status, answer.text
    return answer.json()


def work(kind: str, consumer: str, entry_id: str, **extra: Any) -> dict[str, Any]:
    agent = consumer.rsplit("-", 1)[0]
    return {
        "type": kind,
        "agentId": agent,
        "consumer": consumer,
        "stream": S,
        "group": G,
        "entryId": entry_id,
        "issueId": "rc-1",
        **extra,
    }


async def dispatch(client: httpx.AsyncClient, redis: Redis, issue: str = "rc-1") -> str:
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    answer = await client.post(
        "/api/events",
        json={"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "dev-e", "payload": {}},
        headers=AS_AGENT,
    )
    assert answer.status_code == 201, answer.text
    entry_id: str = answer.json()["entryId"]
    return entry_id


def kinds(story: dict[str, Any]) -> list[str]:
    return [item["kind"] for item in story["timeline"]]


async def test_an_issue_reclaimed_from_a_dead_consumer_tells_its_whole_story(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    entry = await dispatch(client, redis)
    assert await read(redis, S, G, "dev-e-0", 1) == [entry]
    assert (await event(client, work("WORK_STARTED", "dev-e-0", entry)))["attempt"] == 1
    for _ in range(5):
        await event(client, work("WORK_PROGRESS", "dev-e-0", entry, attempt=1))

    running = (await client.get("/api/work/rc-1", headers=AS_VIEWER)).json()
    assert running["state"] == "running"
    assert running["groups"] == [
        {"group": G, "state": "running", "holder": "dev-e-0", "attempt": 1}
    ]
    assert kinds(running) == ["DISPATCHED", "STARTED", "PROGRESS"]
    assert running["timeline"][2]["count"] == 5

    # dev-e never heartbeats (down); qa-e-0 does: the scan moves the entry to it.
    await register(redis, S, G, "qa-e-0")
    await heartbeat(client, "qa-e", "qa-e-0")
    scan = await client.post("/api/reaper/scan?dryRun=false", headers=AS_OPERATOR)
    assert scan.json()["reclaimed"] == 1, scan.text
    assert (await event(client, work("WORK_STARTED", "qa-e-0", entry)))["attempt"] == 2
    await event(client, work("WORK_COMPLETED", "dev-e-0", entry, attempt=1), 409)  # fenced
    await event(client, work("WORK_COMPLETED", "qa-e-0", entry, attempt=2))
    await redis.xack(S, G, entry)

    done = (await client.get("/api/work/rc-1", headers=AS_VIEWER)).json()
    assert done["state"] == "done", done
    assert done["issueId"] == "rc-1" and done["entryId"] == entry and done["stream"] == S
    assert done["groups"] == [{"group": G, "state": "done", "holder": None, "attempt": 2}]
    assert kinds(done) == [
        "DISPATCHED",
        "STARTED",
        "PROGRESS",
        "RECLAIMED",
        "STARTED",
        "FENCED",
        "COMPLETED",
    ]
    moved = done["timeline"][3]
    assert (moved["from"], moved["to"], moved["reason"]) == ("dev-e-0", "qa-e-0", "down")
    assert done["timeline"][4]["attempt"] == 2 and done["timeline"][4]["consumer"] == "qa-e-0"
    assert done["timeline"][5]["attempt"] == 1
    times = [item["at"] for item in done["timeline"]]
    assert times == sorted(times)

    by_entry = (await client.get(f"/api/streams/{S}/entries/{entry}", headers=AS_VIEWER)).json()
    assert kinds(by_entry) == kinds(done) and by_entry["state"] == "done"


async def test_a_never_dispatched_issue_is_404_and_viewers_may_read(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    missing = await client.get("/api/work/rc-404", headers=AS_VIEWER)
    assert missing.status_code == 404
    assert "rc-404" in missing.json()["detail"]
    assert (await client.get("/api/work/rc-404")).status_code == 401
    await dispatch(client, redis, "rc-7")
    unread = (await client.get("/api/work/rc-7", headers=AS_VIEWER)).json()
    assert unread["state"] == "unread"
    assert unread["groups"] == [{"group": G, "state": "unread", "holder": None, "attempt": None}]
    assert kinds(unread) == ["DISPATCHED"]


async def test_ten_thousand_progress_reports_are_one_bounded_item_and_pages_follow(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    entry = await dispatch(client, redis)
    await read(redis, S, G, "dev-e-0", 1)
    await event(client, work("WORK_STARTED", "dev-e-0", entry))
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO events (tenant, kind, agent_id, consumer, stream, entry_id, "
                "issue_id, attempt) SELECT 'default', 'WORK_PROGRESS', 'dev-e', 'dev-e-0', "
                ":stream, :entry, 'rc-1', 1 FROM generate_series(1, 10000)"
            ),
            {"stream": S, "entry": entry},
        )
    await event(client, work("WORK_FAILED", "dev-e-0", entry, attempt=1, error="boom"))

    story = (await client.get("/api/work/rc-1", headers=AS_VIEWER)).json()
    assert kinds(story) == ["DISPATCHED", "STARTED", "PROGRESS", "FAILED"]
    assert story["timeline"][2]["count"] == 10_000
    assert story["timeline"][3]["reason"] == "boom"
    assert story["state"] == "failed" and story.get("next") is None

    first = await client.get("/api/work/rc-1?limit=2", headers=AS_VIEWER)
    assert kinds(first.json()) == ["DISPATCHED", "STARTED"]
    assert 'rel="next"' in first.headers["link"]
    rest = await client.get(f"/api/work/rc-1?after={first.json()['next']}", headers=AS_VIEWER)
    assert kinds(rest.json()) == ["PROGRESS", "FAILED"]
    assert rest.json()["timeline"][0]["count"] == 10_000


def progress_reports(story: dict[str, Any]) -> int:
    """The WORK_PROGRESS rows a page's items stand for: runs by their count, fenced ones."""
    return sum(
        item.get("count", 1)
        if item["kind"] == "PROGRESS"
        else int(item["kind"] == "FENCED" and item["reason"].startswith("WORK_PROGRESS"))
        for item in story["timeline"]
    )


async def test_ten_thousand_progress_reports_that_cannot_fold_are_one_page_and_a_way_on(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    """Two groups work on the entry at once and report in turn: no two reports in a row are of
    one attempt, so none fold. The story is still one bounded page that says where the rest
    is, and the pages that follow reach every report once, in order."""
    entry = await dispatch(client, redis)
    await redis.xgroup_create(S, "auditors", id="0")
    assert await read(redis, S, G, "dev-e-0", 1) == [entry]
    assert await read(redis, S, "auditors", "qa-e-0", 1) == [entry]
    await event(client, work("WORK_STARTED", "dev-e-0", entry))
    await event(client, {**work("WORK_STARTED", "qa-e-0", entry), "group": "auditors"})
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO events (tenant, kind, agent_id, consumer, stream, group_name, "
                "entry_id, issue_id, attempt) SELECT 'default', 'WORK_PROGRESS', "
                "CASE n % 2 WHEN 0 THEN 'dev-e' ELSE 'qa-e' END, "
                "CASE n % 2 WHEN 0 THEN 'dev-e-0' ELSE 'qa-e-0' END, :stream, "
                "CASE n % 2 WHEN 0 THEN :group ELSE 'auditors' END, :entry, 'rc-1', 1 "
                "FROM generate_series(1, 10000) AS n"
            ),
            {"stream": S, "group": G, "entry": entry},
        )

    first = await client.get("/api/work/rc-1", headers=AS_VIEWER)
    story = first.json()
    assert len(story["timeline"]) == 100  # the default page
    assert kinds(story)[:4] == ["DISPATCHED", "STARTED", "STARTED", "PROGRESS"]
    assert story["state"] == "running" and story["next"] is not None
    assert len(first.content) < 64 * 1024
    link = re.fullmatch(r'<(\?[^>]+)>; rel="next"', first.headers["link"])
    assert link is not None, first.headers["link"]

    second = (await client.get(f"/api/work/rc-1{link.group(1)}", headers=AS_VIEWER)).json()
    assert second["timeline"][0]["at"] >= story["timeline"][-1]["at"]
    reports, times, after, pages = progress_reports(story), [], story["next"], 1
    times += [item["at"] for item in story["timeline"]]
    while after is not None:
        page = await client.get(f"/api/work/rc-1?limit=1000&after={after}", headers=AS_VIEWER)
        assert page.status_code == 200, page.text
        assert len(page.json()["timeline"]) <= 1000
        reports += progress_reports(page.json())
        times += [item["at"] for item in page.json()["timeline"]]
        after, pages = page.json()["next"], pages + 1
    assert reports == 10_000
    assert len(times) == 10_003 and times == sorted(times)
    assert pages == 1 + 10  # 9,903 items after the first page, 1,000 a page
    too_many = await client.get("/api/work/rc-1?limit=1001", headers=AS_VIEWER)
    assert too_many.status_code == 422


async def test_a_foreign_entry_is_told_with_what_is_known(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    await redis.xgroup_create(S, "audit", id="$")
    entry = await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "ext-9"})
    await read(redis, S, G, "dev-e-0", 1)
    story = (await client.get(f"/api/streams/{S}/entries/{entry}", headers=AS_VIEWER)).json()
    assert story["issueId"] == "ext-9" and story["timeline"] == []
    groups = {g["group"]: g for g in story["groups"]}
    assert groups[G] == {"group": G, "state": "pending", "holder": "dev-e-0", "attempt": None}
    assert groups["audit"]["state"] == "unread"
    assert story["state"] == "pending"
    gone = await client.get(f"/api/streams/{S}/entries/1-1", headers=AS_VIEWER)
    assert gone.status_code == 404
    other = await client.get(f"/api/streams/elsewhere/entries/{entry}", headers=AS_VIEWER)
    assert other.status_code == 404


async def test_a_dispatch_appended_again_keeps_one_story(
    client: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    """After Redis lost the entry, the dispatch is appended again (ISSUE_ASSIGNED with
    `replaces`): the story is told across both entries, the new one current."""
    old = await dispatch(client, redis)
    await read(redis, S, G, "dev-e-0", 1)
    await event(client, work("WORK_STARTED", "dev-e-0", old))
    new = await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "rc-1"})
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO events (tenant, kind, agent_id, stream, entry_id, issue_id, detail) "
                "VALUES ('default', 'ISSUE_ASSIGNED', 'dev-e', :s, :e, 'rc-1', "
                "CAST(:d AS jsonb))"
            ),
            {"s": S, "e": new, "d": f'{{"replaces": "{old}"}}'},
        )
    story = (await client.get("/api/work/rc-1", headers=AS_VIEWER)).json()
    assert story["entryId"] == new and story["entries"] == [old, new]
    assert kinds(story) == ["DISPATCHED", "STARTED", "DISPATCHED"]
    assert story["timeline"][2]["replaces"] == old
    assert story["state"] == "unread"


async def test_an_entry_without_an_issue_and_names_that_cannot_exist(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    entry = await redis.xadd(S, {"type": "SOMETHING_ELSE"})
    story = (await client.get(f"/api/streams/{S}/entries/{entry}", headers=AS_VIEWER)).json()
    assert "issueId" not in story or story["issueId"] is None
    assert story["state"] == "unread" and story["timeline"] == []
    nul = await client.get("/api/work/rc%001", headers=AS_VIEWER)
    assert nul.status_code == 404
    bad = await client.get("/api/reclaims?reason=a%0Ab", headers=AS_VIEWER)
    assert bad.status_code == 422


async def test_ids_redis_would_refuse_are_422(client: httpx.AsyncClient, redis: Redis) -> None:
    huge = "18446744073709551616-0"
    for path in (
        f"/api/streams/{S}/entries/{huge}",
        f"/api/streams/{S}/groups/{G}/pending?after={huge}",
    ):
        answer = await client.get(path, headers=AS_VIEWER)
        assert answer.status_code == 422, (path, answer.text)


async def test_each_group_fanning_out_has_its_own_state(
    client: httpx.AsyncClient, redis: Redis
) -> None:
    """Work is owned per group: `auditors` still runs the entry `G` has finished (and acked)."""
    entry = await dispatch(client, redis)
    await redis.xgroup_create(S, "auditors", id="0")
    assert await read(redis, S, G, "dev-e-0", 1) == [entry]
    assert await read(redis, S, "auditors", "qa-e-0", 1) == [entry]
    await event(client, work("WORK_STARTED", "dev-e-0", entry))
    audit = {**work("WORK_STARTED", "qa-e-0", entry), "group": "auditors"}
    assert (await event(client, audit))["attempt"] == 1
    await event(client, work("WORK_COMPLETED", "dev-e-0", entry, attempt=1))
    await redis.xack(S, G, entry)
    story = (await client.get("/api/work/rc-1", headers=AS_VIEWER)).json()
    states = {g["group"]: (g["state"], g["holder"], g["attempt"]) for g in story["groups"]}
    assert states == {G: ("done", None, 1), "auditors": ("running", "qa-e-0", 1)}, states
