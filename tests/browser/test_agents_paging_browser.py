"""The console's Agents page in a real browser, at a size where it must page: 123 agents (the
page holds 100), under a root path, the Next link carrying `after`, the live refresh keeping
the page it is on.

The agents heard from stay up for the whole test (RIG_AGENT_DOWN_MS of an hour): what it
checks is the paging, and on a loaded machine signing in and paging can take longer than a
short threshold, after which they would rightly be shown down."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.async_api import Browser, expect
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import conductor_env
from tests.integration.helpers import serve, wait_for

from .conftest import BOUND_MS, BOUND_S, settled

pytestmark = pytest.mark.timeout(240)

VIEWER, AGENT = "viewer-paging-secret", "agent-paging-secret"
CONFIGURED = [f"agent-{n:03}" for n in range(120)]  # never heard from: down
HEARD = ["agent-000", "agent-050", "zeta-e", "alpha-e", "mid-e"]
UNCONFIGURED = sorted(set(HEARD) - set(CONFIGURED))  # after agent-119: on the second page
EVERYONE = sorted({*CONFIGURED, *HEARD})


async def test_the_agents_page_pages_through_every_agent(
    browser: Browser, redis: Redis, redis_url: str, database_url: str, engine: AsyncEngine
) -> None:
    """`engine` empties the tables first: agents earlier tests heard from are not listed."""
    env = conductor_env(
        CONFIGURED,
        RIG_SCAN_INTERVAL_S="3600",
        RIG_STARTUP_DELAY_S="3600",
        RIG_VIEWER_TOKENS=VIEWER,
        RIG_API_TOKENS=AGENT,
        RIG_HTTP_ROOT_PATH="/rig",
        RIG_AGENT_DOWN_MS="3600000",
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(
            base_url=f"{conductor.url}/rig", headers={"Authorization": f"Bearer {AGENT}"}
        ) as api,
    ):
        for agent in HEARD:
            beat = {"type": "HEARTBEAT", "agentId": agent, "consumer": f"{agent}-pod-0"}
            assert (await api.post("/api/events", json=beat)).status_code == 202

        async def all_up() -> bool:  # the heartbeats are written behind the 202
            agents = [(await api.get(f"/api/agents/{agent}")).json() for agent in HEARD]
            return all(not agent["down"] for agent in agents)

        await wait_for(all_up, within=BOUND_S)
        page = await browser.new_page()
        await page.goto(f"{conductor.url}/rig/ui/agents")
        await page.fill("#token", VIEWER)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(re.compile(r"/rig/ui/agents$"))
        await settled(page)

        rows = page.locator("#agents tbody tr")
        await expect(rows).to_have_count(100)
        first = await page.locator("#agents tbody tr td:first-child").all_inner_texts()
        await expect(page.locator("#first")).to_have_count(0)

        await page.click("#next")
        await expect(page).to_have_url(re.compile(r"/rig/ui/agents\?after="))
        await settled(page)
        await expect(rows).to_have_count(len(EVERYONE) - 100)
        second = await page.locator("#agents tbody tr td:first-child").all_inner_texts()
        assert len(first + second) == len(set(first + second)) and set(first + second) == {
            *EVERYONE
        }
        await expect(page.locator("#next")).to_have_count(0)
        await expect(page.locator("tr.up td:first-child")).to_have_text(UNCONFIGURED)
        # The live part refreshes the page it is on, not the first.
        async with page.expect_request(
            lambda r: r.headers.get("hx-request") == "true", timeout=BOUND_MS
        ) as polled:
            pass
        request = await polled.value
        assert "/rig/ui/agents?after=" in request.url
        await expect(rows).to_have_count(len(EVERYONE) - 100)

        await page.click("#first")
        await expect(page).to_have_url(re.compile(r"/rig/ui/agents$"))
        await settled(page)
        await expect(rows).to_have_count(100)
