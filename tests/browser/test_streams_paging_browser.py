"""The console's Streams page and a group's page in a real browser, at sizes where they must
page: 25 streams (a page holds 20) and a group of 130 consumers (a page holds 100). The
streams come from what the last scan measured, the group's consumers live from Redis."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.async_api import Browser, expect
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import conductor_env
from tests.integration.helpers import fill, read, register, serve

from .conftest import settled

pytestmark = pytest.mark.timeout(240)

VIEWER, AGENT = "viewer-streams-secret", "agent-streams-secret"
STREAMS = [f"page:{n:02}" for n in range(25)]
BIG = "page:07"
CONSUMERS = [f"builder-{n:03}" for n in range(130)]


async def test_the_streams_and_a_big_groups_consumers_page(
    browser: Browser, redis: Redis, redis_url: str, database_url: str, engine: AsyncEngine
) -> None:
    """`engine` empties the tables first: no measurement of an earlier test is shown."""
    for stream in STREAMS:
        await fill(redis, stream, "workers", 1)
    for name in CONSUMERS:
        await register(redis, BIG, "workers", name)
    await read(redis, BIG, "workers", "builder-129", 1)  # the one consumer holding an entry
    env = conductor_env(
        ["builder"],
        RIG_STREAMS="page:*",
        RIG_SCAN_INTERVAL_S="3600",
        RIG_STARTUP_DELAY_S="3600",
        RIG_VIEWER_TOKENS=VIEWER,
        RIG_API_TOKENS=AGENT,
        RIG_ALLOW_ANONYMOUS="false",
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(
            base_url=conductor.url, headers={"Authorization": f"Bearer {AGENT}"}
        ) as api,
    ):
        beat = {"type": "HEARTBEAT", "agentId": "builder"}
        assert (await api.post("/api/events", json=beat)).status_code == 202
        page = await browser.new_page()
        await page.goto(f"{conductor.url}/ui/streams")
        await page.fill("#token", VIEWER)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(re.compile(r"/ui/streams$"))
        await settled(page)

        rows = page.locator("#groups tbody tr")
        await expect(rows).to_have_count(20)
        first = await page.locator("#groups tbody tr td:first-child").all_inner_texts()
        await page.click("#next")
        await expect(page).to_have_url(re.compile(r"/ui/streams\?after=page%3A19$"))
        await settled(page)
        await expect(rows).to_have_count(5)
        second = await page.locator("#groups tbody tr td:first-child").all_inner_texts()
        assert first + second == STREAMS
        await expect(page.locator("#next")).to_have_count(0)

        # The big group: its consumers a page at a time, the one holding an entry included.
        await page.click("#first")
        await expect(rows).to_have_count(20)
        await page.locator("#groups tbody tr", has_text=BIG).locator("a").first.click()
        consumers = page.locator("#consumers tbody tr")
        await expect(consumers).to_have_count(100)
        await expect(page.locator("h1 + p")).to_contain_text("130 consumers")
        await page.click("#next")
        await expect(consumers).to_have_count(30)
        await expect(page.locator('tr[data-consumer="builder-129"] td.pending')).to_have_text("1")
        await expect(page.locator("#next")).to_have_count(0)
        await page.click("#first")
        await expect(consumers).to_have_count(100)
