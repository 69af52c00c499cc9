"""The operator console over HTTP (real app, Redis and PostgreSQL): sessions, CSRF, roles, and
every view and action. The browser tests (tests/browser) drive the same pages in Chromium."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres.tables import assignments, events
from rig_conductor.adapters.redis import inspection as redis_inspect

from .console_kit import (
    AGENT,
    OPERATOR,
    VIEWER,
    G,
    S,
    client_of,
    flash_of,
    sign_in,
    stuck,
)
from .helpers import idle_at_least, owners, register


async def test_a_viewer_sees_everything_and_may_change_nothing(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    held = await stuck(redis, console)
    await redis.xadd(
        f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries", "issueId": "rc-9"}
    )
    csrf = await sign_in(console, VIEWER)
    letters = await console.get("/ui/deadletters")
    assert "rc-9" in letters.text and "Requeue" not in letters.text and "Delete" not in letters.text
    pending = await console.get(
        "/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0"}
    )
    assert held[0] in pending.text and "Move selected" not in pending.text
    refused = await console.post(
        "/ui/move",
        data={
            "csrf": csrf,
            "stream": S,
            "group": G,
            "consumer": "dev-e-0",
            "target": "qa-e-0",
            "entries": [held[0]],
        },
    )
    assert refused.status_code == 403 and "viewer" in refused.text
    assert set((await owners(redis, S, G)).values()) == {"dev-e-0"}
    # A dry run changes nothing: a viewer may preview.
    preview = await console.post("/ui/scan", data={"csrf": csrf})
    assert preview.status_code == 200 and 'class="n-reclaimed">5<' in preview.text
    assert "Apply" not in preview.text
    assert (await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})).status_code == 403


async def test_agent_tokens_act_only_without_operator_tokens(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    async for console in client_of(build()):
        csrf = await sign_in(console, AGENT)
        answer = await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})
        assert answer.status_code == 403 and "agent" in answer.text
    async for console in client_of(build(operator_tokens="")):
        csrf = await sign_in(console, AGENT)
        answer = await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})
        assert answer.status_code == 200 and "Scan done" in answer.text


async def test_overview_and_group_show_the_down_consumer_and_what_it_holds(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await stuck(redis, console, 7)
    await sign_in(console, VIEWER)
    overview = await console.get("/ui")
    row = re.search(r"<tr class=\"bad\">(.*?)</tr>", overview.text, re.S)
    assert row, overview.text
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    assert cells[0] == S and ">workers<" in cells[1]
    assert cells[2] == "7" and cells[5] == "1" and cells[6] == "7"  # pending, down, held by down
    polled = await console.get("/ui", headers={"HX-Request": "true"})
    assert polled.text.lstrip().startswith('<div id="live"') and "<html" not in polled.text
    group = await console.get("/ui/group", params={"stream": S, "name": G})
    dev = re.search(r'data-consumer="dev-e-0">(.*?)</tr>', group.text, re.S)
    qa = re.search(r'data-consumer="qa-e-0">(.*?)</tr>', group.text, re.S)
    assert dev and qa
    assert "state-down" in dev.group(1) and ">7<" in dev.group(1)
    assert "agent-heartbeat-stale" in dev.group(1) or "agent-never-heartbeated" in dev.group(1)
    assert "state-up" in qa.group(1)
    missing = await console.get("/ui/group", params={"stream": S, "name": "nope"})
    assert missing.status_code == 404


async def test_the_pending_page_pages_by_id(console: httpx.AsyncClient, redis: Redis) -> None:
    held = await stuck(redis, console, 230)
    await sign_in(console, VIEWER)
    seen: list[str] = []
    after: str | None = None
    for _ in range(5):
        params = {
            "stream": S,
            "group": G,
            "consumer": "dev-e-0",
            **({"after": after} if after else {}),
        }
        page = await console.get("/ui/pending", params=params)
        seen += re.findall(r'<td class="mono">(\d+-\d+)</td>', page.text)
        found = re.search(r'after=(\d+-\d+)" id="next"', page.text)
        if not found:
            break
        after = found.group(1)
    assert seen == held  # every entry once, in id order, in three pages
    assert (
        "rc-1"
        in (
            await console.get(
                "/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0"}
            )
        ).text
    )


async def test_move_by_hand_is_guarded_reserves_an_attempt_and_logs_manual(
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    held = await stuck(redis, console, 5)
    async with engine.begin() as conn:  # dev-e-0 had started the first entry
        await conn.execute(
            assignments.insert().values(
                tenant="default",
                stream=S,
                entry_id=held[0],
                state="running",
                attempt=1,
                consumer="dev-e-0",
            )
        )
    csrf = await sign_in(console, OPERATOR)
    page = await console.get("/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0"})
    boxes = re.findall(r'name="entries" value="([^"]+)"', page.text)
    assert boxes == held  # the ids, nothing the server would have to trust
    assert re.search(r'<option value="qa-e-0">', page.text)
    assert '<option value="dev-e-0">' not in page.text  # neither the owner nor a down consumer
    # Since the page was drawn, dev-e-0 acked one entry and another was moved to qa-e-0.
    await redis.xack(S, G, held[3])
    await redis.xclaim(S, G, "qa-e-0", 0, [held[4]], justid=True)
    caplog.set_level(logging.INFO)
    form = {
        "csrf": csrf,
        "stream": S,
        "group": G,
        "consumer": "dev-e-0",
        "target": "qa-e-0",
        "entries": [held[0], held[1], held[3], held[4]],
    }
    moved = await console.post("/ui/move", data=form)
    assert await flash_of(console, moved) == (
        "moved 2 of 4 to qa-e-0; 2 no longer pending for this consumer"
    )
    now = await owners(redis, S, G)
    assert [now.get(e) for e in held] == ["qa-e-0", "qa-e-0", "dev-e-0", None, "qa-e-0"]
    for entry in held[:2]:
        assert f"[StreamReclaim] Reclaimed {entry} on {S}: dev-e-0 -> qa-e-0" in caplog.text
    assert f"Reclaimed {held[3]}" not in caplog.text and f"Reclaimed {held[4]}" not in caplog.text
    assert re.search(
        r"\[Console\] operator:[0-9a-f]{8} moved 2 of 4 selected entries on rig:dispatch/workers: "
        r"dev-e-0 -> qa-e-0 \(0 dead-lettered after RIG_MAX_DELIVERIES, 2 not held by dev-e-0\)",
        caplog.text,
    )
    # In JSON too, each line carries reason `manual`.
    formatter = logs.JsonFormatter()
    reclaimed = [
        json.loads(line)
        for record in caplog.records
        if record.name == logs.RECLAIM_LOGGER
        for line in formatter.format(record).splitlines()
    ]
    assert [r["entryId"] for r in reclaimed] == held[:2]
    assert {r["reason"] for r in reclaimed} == {"manual"}
    assert (
        reclaimed[0]["message"] == f"[StreamReclaim] Reclaimed {held[0]} on {S}: dev-e-0 -> qa-e-0"
    )
    async with engine.connect() as conn:
        row = (await conn.execute(select(events).where(events.c.kind == "RECLAIMED"))).one()
        attempt = (
            await conn.execute(
                select(assignments.c.attempt, assignments.c.consumer).where(
                    assignments.c.entry_id == held[0]
                )
            )
        ).one()
    assert row.detail["reason"] == "manual" and row.detail["by"].startswith("operator:")
    assert sorted(row.entry_ids) == sorted(held[:2]) and row.consumer == "dev-e-0"
    assert tuple(attempt) == (2, "qa-e-0")  # a new attempt: dev-e-0's late reports are fenced
    history = await console.get("/ui/reclaims", params={"reason": "manual"})
    assert "dev-e-0" in history.text and "qa-e-0" in history.text and ">2<" in history.text
    # A target that is not live is refused.
    form["target"] = "dev-e-1"
    await register(redis, S, G, "dev-e-1")
    refused = await console.post("/ui/move", data=form)
    assert refused.status_code == 409 and "not live" in refused.text


async def test_a_move_guards_each_entry_with_the_idle_time_redis_reported(
    console: httpx.AsyncClient, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The min-idle of each XCLAIM is the idle time the move looked up, so an entry the owner
    touches between that look and the claim stays where it is."""
    held = await stuck(redis, console, 2)
    csrf = await sign_in(console, OPERATOR)
    await idle_at_least(redis, S, G, 200)  # both entries idle 200 ms or more when the move looks
    looked_up = redis_inspect.held_by

    async def then_touched(*args: Any, **kwargs: Any) -> Any:
        found = await looked_up(*args, **kwargs)
        await redis.xclaim(S, G, "dev-e-0", 0, [held[1]], justid=True)  # idle back to 0
        return found

    monkeypatch.setattr(redis_inspect, "held_by", then_touched)
    form = {"csrf": csrf, "stream": S, "group": G, "consumer": "dev-e-0", "target": "qa-e-0"}
    moved = await console.post("/ui/move", data={**form, "entries": held})
    assert await flash_of(console, moved) == (
        "moved 1 of 2 to qa-e-0; 1 left: touched since they were looked up"
    )
    assert await owners(redis, S, G) == {held[0]: "qa-e-0", held[1]: "dev-e-0"}
    # An idle time from the form is not an entry id: refused, nothing moves.
    sneaky = await console.post("/ui/move", data={**form, "entries": [f"{held[1]}@0"]})
    assert sneaky.status_code == 400


async def test_a_move_dead_letters_what_reached_max_deliveries_as_the_reaper_does(
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    held = await stuck(redis, console, 3)
    for _ in range(4):  # held[0]: delivered 5 times (RIG_MAX_DELIVERIES)
        await redis.xclaim(S, G, "dev-e-0", 0, [held[0]])
    async with engine.begin() as conn:  # held[1]: its fifth attempt recorded
        await conn.execute(
            assignments.insert().values(
                tenant="default", stream=S, entry_id=held[1], state="running", attempt=5
            )
        )
    csrf = await sign_in(console, OPERATOR)
    page = await console.get("/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0"})
    assert "reached RIG_MAX_DELIVERIES (5) is dead-lettered instead" in page.text
    caplog.set_level(logging.INFO)
    moved = await console.post(
        "/ui/move",
        data={
            "csrf": csrf,
            "stream": S,
            "group": G,
            "consumer": "dev-e-0",
            "target": "qa-e-0",
            "entries": held,
        },
    )
    assert await flash_of(console, moved) == (
        "moved 1 of 3 to qa-e-0; 2 dead-lettered: they had reached RIG_MAX_DELIVERIES, "
        "as the reaper would have done"
    )
    assert await owners(redis, S, G) == {held[2]: "qa-e-0"}
    letters = {f["originalId"]: f for _, f in await redis.xrange(f"{S}:dlq")}
    assert set(letters) == set(held[:2])
    assert letters[held[0]]["reason"] == "max-deliveries" and letters[held[0]]["deliveries"] == "5"
    assert letters[held[1]]["deliveries"] == "5" and letters[held[1]]["issueId"] == "rc-2"
    for entry in held[:2]:
        assert f"[StreamReclaim] Dead-lettered {entry} on {S} after 5 deliveries" in caplog.text
    async with engine.connect() as conn:
        dead = (await conn.execute(select(events).where(events.c.kind == "DEAD_LETTERED"))).all()
        states = dict(
            (await conn.execute(select(assignments.c.entry_id, assignments.c.state))).all()
        )
    assert {row.entry_id for row in dead} == set(held[:2])
    assert states[held[0]] == states[held[1]] == "dead"


async def test_dead_letters_filter_requeue_selected_and_delete_all_that_match(
    console: httpx.AsyncClient, redis: Redis, engine: AsyncEngine
) -> None:
    ids = [
        await redis.xadd(
            f"{S}:dlq",
            {
                "originalId": f"1-{i}",
                "stream": S,
                "group": G,
                "consumer": "dev-e-0",
                "deliveries": "5",
                "reason": "max-deliveries",
                "issueId": f"rc-{i}",
                "repo": "alpha" if i % 2 else "beta",
            },
        )
        for i in range(1, 121)
    ]
    csrf = await sign_in(console, OPERATOR)
    beta = await console.get("/ui/deadletters", params={"q": "beta"})
    shown = re.findall(r'data-dlq-id="([^"]+)"', beta.text)
    assert len(shown) == 50 and all(ids.index(i) % 2 == 1 for i in shown)  # rc-2, rc-4, ...
    assert shown[0] == ids[-1]  # newest first
    older = re.search(r'before=([\d-]+)" id="next"', beta.text)
    assert older
    requeued = await console.post(
        "/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "ids": shown[:2]}
    )
    assert requeued.status_code == 303 and "done=requeued&n=2" in requeued.headers["location"]
    assert await redis.xlen(S) == 2
    deleted = await console.post(
        "/ui/deadletters/delete",
        data={"csrf": csrf, "stream": S, "q": "beta", "all_matching": "true"},
    )
    assert "done=deleted&n=58" in deleted.headers["location"]
    left = await redis.xrange(f"{S}:dlq")
    assert len(left) == 60 and all(f["repo"] == "alpha" for _, f in left)
    async with engine.connect() as conn:
        kinds = [
            k
            for (k,) in await conn.execute(
                select(events.c.kind).where(events.c.kind.like("DEAD_LETTER_%"))
            )
        ]
    assert kinds.count("DEAD_LETTER_REQUEUED") == 2 and kinds.count("DEAD_LETTER_DELETED") == 58


async def test_scan_preview_changes_nothing_then_apply_moves_and_shows_in_the_overview(
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    held = await stuck(redis, console, 4)
    csrf = await sign_in(console, OPERATOR)
    preview = await console.post("/ui/scan", data={"csrf": csrf})
    assert "Preview" in preview.text and 'class="n-reclaimed">4<' in preview.text
    assert "qa-e-0: 4" in preview.text and 'id="apply"' in preview.text
    assert set((await owners(redis, S, G)).values()) == {"dev-e-0"}
    caplog.set_level(logging.INFO)
    applied = await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})
    assert "Scan done" in applied.text
    assert re.search(r"\[Console\] operator:[0-9a-f]{8} ran a scan: 4 reclaimed", caplog.text)
    async with engine.connect() as conn:
        [detail] = (
            await conn.execute(select(events.c.detail).where(events.c.kind == "SCAN_REQUESTED"))
        ).scalars()
    assert detail["by"].startswith("operator:") and detail["reclaimed"] == 4
    assert {(await owners(redis, S, G))[e] for e in held} == {"qa-e-0"}
    overview = await console.get("/ui")
    scans = re.search(r'<table class="grid" id="scans">(.*?)</table>', overview.text, re.S)
    assert scans and "dry run" in scans.group(1) and "down 4" in scans.group(1)
    series = re.search(
        r'<script type="application/json" class="series">(.*?)</script>', overview.text
    )
    assert series and '"reclaimed": [4]' in series.group(1)
    history = await console.get("/ui/reclaims", params={"reason": "down"})
    assert "dev-e-0" in history.text and ">4<" in history.text


async def test_the_vendored_assets_are_served(console: httpx.AsyncClient) -> None:
    for name in ("vendor/htmx-2.0.11.min.js", "vendor/uPlot-1.6.32.iife.min.js", "console.css"):
        assert (await console.get(f"/ui/static/{name}")).status_code == 200


async def test_reclaim_history_filters_by_stream_agent_reason_and_time(
    console: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    now = datetime.now(UTC)
    rows = [  # (stream, from agent, to agent, reason, hours ago, first entry)
        ("rig:dispatch", "dev-e", "qa-e", "down", 0.1, "1-1"),
        ("rig:dispatch", "qa-e", "dev-e", "stalled", 0.2, "2-1"),
        ("assignments:dev-e", "dev-e", "ops-e", "pod-gone", 3, "3-1"),
        ("assignments:ops-e", "ops-e", "qa-e", "manual", 30, "4-1"),
    ]
    async with engine.begin() as conn:
        for stream, source, target, reason, hours, entry in rows:
            detail = {"toConsumer": f"{target}-0", "toAgent": target, "reason": reason}
            await conn.execute(
                events.insert().values(
                    tenant="default",
                    kind="RECLAIMED",
                    occurred_at=now - timedelta(hours=hours),
                    agent_id=source,
                    consumer=f"{source}-0",
                    stream=stream,
                    group_name=G,
                    detail=detail,
                    entry_ids=[entry],
                )
            )
    await sign_in(console, VIEWER)

    async def shown(**query: str) -> list[str]:
        page = await console.get("/ui/reclaims", params=query)
        assert page.status_code == 200
        return re.findall(r'<td class="mono"><a [^>]*>(\d+-\d+)</a>', page.text)

    assert await shown() == ["4-1", "3-1", "2-1", "1-1"]  # newest id first
    assert await shown(stream="rig:dispatch") == ["2-1", "1-1"]
    assert await shown(stream="assignments:ops-e") == ["4-1"]
    assert await shown(agent="ops-e") == ["4-1", "3-1"]  # entries that left it or went to it
    assert await shown(agent="dev-e") == ["3-1", "2-1", "1-1"]
    assert await shown(hours="1") == ["2-1", "1-1"]
    assert await shown(hours="5") == ["3-1", "2-1", "1-1"]
    assert await shown(agent="dev-e", stream="rig:dispatch", reason="stalled") == ["2-1"]
    assert await shown(agent="nobody") == []
    bad = await console.get("/ui/reclaims", params={"hours": "-1"})
    assert bad.status_code == 400
