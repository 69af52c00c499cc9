"""The console's way to the work: the overview's last hour (completions per 5 minutes and the
groups' lag, from the event log and the scans), and the reclaim and dead-letter pages linking
each entry and issue to its story (the work page). Real app, Redis and PostgreSQL."""

from __future__ import annotations

import html
import json
import re

import httpx
from redis.asyncio import Redis

from .console_kit import AGENT, OPERATOR, G, S, sign_in, stuck
from .helpers import fill, read


async def work(console: httpx.AsyncClient, kind: str, entry: str, **more: object) -> None:
    answer = await console.post(
        "/api/events",
        json={
            "type": kind,
            "agentId": "qa-e",
            "consumer": "qa-e-0",
            "stream": S,
            "group": G,
            "entryId": entry,
            "issueId": f"rc-{entry}",
            **more,
        },
        headers={"Authorization": f"Bearer {AGENT}"},
    )
    assert answer.status_code == 202, answer.text


async def test_the_overview_shows_the_last_hours_completions_and_lag(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await stuck(redis, console, 4)  # dev-e-0, down, holds 4: the scan moves them to qa-e-0
    await fill(redis, S, G, 2, start=11)
    done = await read(redis, S, G, "qa-e-0", 2)
    for entry in done:
        await work(console, "WORK_STARTED", entry)
        await work(console, "WORK_COMPLETED", entry, attempt=1)
        await redis.xack(S, G, entry)
    await fill(redis, S, G, 3, start=21)  # read by nobody yet: the group's lag
    csrf = await sign_in(console, OPERATOR)
    applied = await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})
    assert "Scan done" in applied.text

    overview = await console.get("/ui")
    found = re.search(
        r'<script type="application/json" class="work-series">(.*?)</script>', overview.text
    )
    assert found, overview.text[-2000:]
    series = json.loads(found.group(1))
    assert len(series["t"]) == len(series["finished"]) == len(series["lag"]) == 12
    assert series["t"] == sorted(series["t"]) and series["t"][1] - series["t"][0] == 300
    assert sum(series["finished"]) == 2
    assert [lag for lag in series["lag"] if lag is not None][-1] == 3
    assert "2 completions accepted in the last hour" in overview.text
    assert 'id="work-plot"' in overview.text


async def test_the_reclaim_and_dead_letter_pages_link_to_the_work(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    held = await stuck(redis, console, 2)
    await redis.xadd(
        f"{S}:dlq",
        {
            "originalId": "1-1",
            "stream": S,
            "group": G,
            "reason": "max-deliveries",
            "issueId": "rc-9",
        },
    )
    csrf = await sign_in(console, OPERATOR)
    assert (
        "Scan done" in (await console.post("/ui/scan", data={"csrf": csrf, "apply": "true"})).text
    )

    reclaims = await console.get("/ui/reclaims")
    links = set(map(html.unescape, re.findall(r'href="(/ui/work\?[^"]+)"', reclaims.text)))
    assert links == {
        str(httpx.URL("/ui/work", params={"q": entry, "stream": S})) for entry in held
    }, reclaims.text
    letters = await console.get("/ui/deadletters")
    links = set(map(html.unescape, re.findall(r'href="(/ui/work\?[^"]+)"', letters.text)))
    assert links == {
        str(httpx.URL("/ui/work", params={"q": "1-1", "stream": S})),
        str(httpx.URL("/ui/work", params={"q": "rc-9"})),
    }, letters.text
    # The link leads to the story.
    story = await console.get(str(httpx.URL("/ui/work", params={"q": held[0], "stream": S})))
    assert story.status_code == 200 and "RECLAIMED" in story.text.upper()
