"""Finding the work in a real browser: the header's search box leads to one issue's story, its
state per group and its timeline, against a real `rig-conductor serve`, Redis and PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, expect
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import GROUP, STREAM
from tests.integration.helpers import read, register, serve

from .test_console_browser import AGENT, VICTIM, VIEWER, dispatch, env, sign_in

pytestmark = pytest.mark.timeout(120)


async def test_an_operator_finds_one_issue_and_reads_its_story(
    browser: Browser,
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    screenshots: Path,
) -> None:
    consumer = VICTIM[1]
    async with (
        serve(redis_url, database_url, **env()) as conductor,
        httpx.AsyncClient(
            base_url=conductor.url, headers={"Authorization": f"Bearer {AGENT}"}
        ) as api,
    ):
        await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        entry = await dispatch(api, "rc-42")
        assert await read(redis, STREAM, GROUP, consumer, 1) == [entry]
        await register(redis, STREAM, GROUP, "builder-a-pod-0")
        work = {
            "agentId": VICTIM[0],
            "consumer": consumer,
            "stream": STREAM,
            "group": GROUP,
            "entryId": entry,
            "issueId": "rc-42",
        }
        started = await api.post("/api/events", json={"type": "WORK_STARTED", **work})
        assert started.status_code == 202, started.text
        for _ in range(3):
            progress = {"type": "WORK_PROGRESS", "attempt": 1, **work}
            assert (await api.post("/api/events", json=progress)).status_code == 202

        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        await sign_in(page, conductor.url, VIEWER)
        search = page.get_by_label("Find the work")
        await search.fill("rc-42")
        await search.press("Enter")
        await expect(page).to_have_url(re.compile(r"/ui/work\?q=rc-42"))
        await expect(page.locator("#state")).to_have_text("running")
        group = page.locator("#groups tbody tr", has_text=GROUP)
        await expect(group).to_contain_text(consumer)
        await expect(group.locator("td").nth(3)).to_have_text("1")
        kinds = page.locator("#timeline tbody tr td:nth-child(2) .tag")
        await expect(kinds).to_have_text(["DISPATCHED", "STARTED", "PROGRESS"])
        await expect(page.locator("#timeline tbody tr").nth(2)).to_contain_text("\u00d73")
        await page.screenshot(path=screenshots / "work.png", full_page=True)

        # The holder links to its pending entries; an entry id finds the same story.
        await group.get_by_role("link", name=consumer).click()
        await expect(page).to_have_url(re.compile(r"/ui/pending\?"))
        await page.get_by_label("Find the work").fill(entry)
        await page.get_by_label("Find the work").press("Enter")
        await expect(page.locator("#state")).to_have_text("running")
        await expect(page.locator("#work h2").first).to_contain_text("rc-42")

        await page.get_by_label("Find the work").fill("rc-nowhere")
        await page.get_by_label("Find the work").press("Enter")
        await expect(page.locator("#not-found")).to_contain_text("rc-nowhere")
