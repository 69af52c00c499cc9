"""The console in a real browser against a real `rig-conductor serve`, real agents, Redis and
PostgreSQL: an agent is SIGKILLed while it holds entries, and an operator sees it and fixes it.

The conductor's own schedule is off (one scan an hour), so what moves, moves from the console.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, expect
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import GROUP, ONE_READ, STREAM, Fleet, conductor_env, heard_from, pending
from tests.integration.helpers import serve, wait_for

from .conftest import BOUND_S, settled

pytestmark = pytest.mark.timeout(240)

OPERATOR, VIEWER = "op-browser-secret-0001", "viewer-browser-secret-01"
AGENT = "agent-browser-secret-01"
VICTIM = ("builder-b", "builder-b-pod-0")
SURVIVOR = ("builder-a", "builder-a-pod-0")


def env(**extra: str) -> dict[str, str]:
    return conductor_env(
        [VICTIM[0], SURVIVOR[0]],
        RIG_SCAN_INTERVAL_S="3600",
        RIG_STARTUP_DELAY_S="3600",
        RIG_OPERATOR_TOKENS=OPERATOR,
        RIG_VIEWER_TOKENS=VIEWER,
        RIG_API_TOKENS=AGENT,
        **extra,
    )


async def sign_in(page: Page, base: str, token: str) -> None:
    await page.goto(f"{base}/ui")
    await expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    await page.fill("#token", token)
    await page.click("button[type=submit]")
    await expect(page.locator("header .role")).to_be_visible()
    await settled(page)


async def dispatch(api: httpx.AsyncClient, issue: str) -> str:
    answer = await api.post(
        "/api/events",
        json={"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": VICTIM[0], "payload": {}},
    )
    assert answer.status_code == 201, answer.text
    entry_id: str = answer.json()["entryId"]
    return entry_id


async def agent_down(api: httpx.AsyncClient, agent: str) -> bool:
    found = (await api.get(f"/api/agents/{agent}")).json()
    return bool(found["down"])


async def plant_dead_letter(redis: Redis, issue: str) -> str:
    return str(
        await redis.xadd(
            f"{STREAM}:dlq",
            {
                "originalId": "1-1",
                "stream": STREAM,
                "group": GROUP,
                "consumer": VICTIM[1],
                "deliveries": "5",
                "reason": "max-deliveries",
                "type": "ISSUE_ASSIGNED",
                "issueId": issue,
                "payload": "{}",
            },
        )
    )


@pytest.fixture
async def stuck(
    redis: Redis, redis_url: str, database_url: str, tmp_path: Path, engine: AsyncEngine
) -> AsyncIterator[tuple[str, httpx.AsyncClient, Fleet, set[str]]]:
    """A conductor, a survivor, and a SIGKILLed victim still holding its entries (`engine`
    empties the tables first: no scan of an earlier test is listed)."""
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    async with (
        serve(redis_url, database_url, **env()) as conductor,
        httpx.AsyncClient(
            base_url=conductor.url, headers={"Authorization": f"Bearer {AGENT}"}
        ) as api,
    ):
        fleet_env = {"E2E_OUT_DIR": str(out), "RIG_API_TOKEN": AGENT}
        with Fleet(redis_url, conductor.url, tmp_path, fleet_env) as fleet:
            victim = fleet.start(*VICTIM, E2E_FAIL_FIRST="3", E2E_HOLD_FILE=str(hold), **ONE_READ)
            await wait_for(lambda: heard_from(api, victim.consumer), within=BOUND_S)
            for n in range(1, 7):
                await dispatch(api, f"rc-{n}")
            await wait_for(lambda: (out / f"holding-{victim.consumer}").exists(), within=BOUND_S)
            held = set(await pending(redis, victim.consumer))
            assert len(held) >= 4, held  # three failed builds and the one in progress
            victim.kill()
            survivor = fleet.start(*SURVIVOR)
            await wait_for(lambda: heard_from(api, survivor.consumer), within=BOUND_S)
            yield conductor.url, api, fleet, held


async def test_operator_sees_the_killed_agent_and_fixes_it_from_the_browser(
    browser: Browser,
    stuck: tuple[str, httpx.AsyncClient, Fleet, set[str]],
    redis: Redis,
    screenshots: Path,
) -> None:
    base, api, _, held = stuck
    victim = VICTIM[1]
    # The views show what the last scan measured, and this conductor's schedule is off: a dry
    # run once the victim's heartbeat is stale measures what the operator is about to see.
    await wait_for(lambda: agent_down(api, VICTIM[0]), within=BOUND_S)
    assert (await api.post("/api/reaper/scan", params={"dryRun": "true"})).status_code == 200
    kept = await plant_dead_letter(redis, "rc-dead-keep")
    dropped = await plant_dead_letter(redis, "rc-dead-drop")
    requeued = await plant_dead_letter(redis, "rc-dead-requeue")
    page = await browser.new_page(viewport={"width": 1400, "height": 900})
    page.on("dialog", lambda dialog: dialog.accept())
    await sign_in(page, base, OPERATOR)
    await expect(page.locator("header .role")).to_have_text("operator")

    # Overview: the group shows what the down consumer holds (once its heartbeat is stale).
    row = page.locator("#groups tbody tr", has_text=GROUP)
    await expect(row).to_have_class(re.compile("bad"))
    await expect(row.locator("td").nth(6)).to_have_text(str(len(held)))
    await expect(page.locator("#plot canvas")).to_have_count(1)
    # A few scans' points: the time axis spans minutes, not the years uPlot picks by itself.
    low, high = await page.evaluate(
        "() => { const s = document.getElementById('plot').uplot.scales.x; return [s.min, s.max]; }"
    )
    assert 0 < high - low <= 3_600
    # The last hour's work: completions per 5 minutes and the groups' lag, drawn too.
    await expect(page.locator("#work-plot canvas")).to_have_count(1)
    await page.screenshot(path=screenshots / "overview.png", full_page=True)

    # Group: the victim is plainly down, with its pending count.
    await row.locator("a", has_text=GROUP).click()
    consumer = page.locator(f'tr[data-consumer="{victim}"]')
    await expect(consumer.locator(".state")).to_have_text("down")
    await expect(consumer.locator("td.pending")).to_have_text(str(len(held)))
    await expect(page.locator(f'tr[data-consumer="{SURVIVOR[1]}"] .state')).to_have_text("up")
    await page.screenshot(path=screenshots / "group.png", full_page=True)

    # Its pending entries, with their fields.
    await consumer.locator("a").click()
    await expect(page.locator("#pending tbody tr")).to_have_count(len(held))
    await expect(page.locator("#target option")).to_have_text(re.compile(SURVIVOR[1]))
    await page.screenshot(path=screenshots / "pending.png", full_page=True)

    # Move one by hand to the survivor.
    first = sorted(held)[0]
    await page.locator(f'input[name=entries][value="{first}"]').check()
    await page.click("text=Move selected")
    await expect(page.locator(".flash")).to_have_text(f"Done: moved 1 of 1 to {SURVIVOR[1]}")
    await expect(page.locator("#pending tbody tr")).to_have_count(len(held) - 1)
    assert first not in set(await pending(redis, victim))

    # Dead letters: requeue one (back on the stream), delete one.
    await page.click("header nav >> text=Dead letters")
    await expect(page.locator("#deadletters tbody tr")).to_have_count(3)
    await page.screenshot(path=screenshots / "deadletters.png", full_page=True)
    await page.locator(f'tr[data-dlq-id="{requeued}"] button.requeue-one').click()
    await expect(page.locator(".flash")).to_have_text("Done: requeued 1")
    [(_, fields)] = await redis.xrevrange(STREAM, count=1)
    assert fields["issueId"] == "rc-dead-requeue" and "reason" not in fields
    await page.locator(f'tr[data-dlq-id="{dropped}"] button.delete-one').click()
    await expect(page.locator(".flash")).to_have_text("Done: deleted 1")
    assert [i for i, _ in await redis.xrange(f"{STREAM}:dlq")] == [kept]
    await expect(page.locator("#deadletters tbody tr")).to_have_count(1)

    # Scan now: a preview changes nothing; applying moves the victim's entries.
    await page.click("header nav >> text=Scan now")
    await page.click("#preview")
    await expect(page.locator("#report .n-reclaimed")).to_have_text(str(len(held) - 1))
    await page.screenshot(path=screenshots / "scan-preview.png", full_page=True)
    assert set(await pending(redis, victim)) == held - {first}
    await page.click("#apply")
    await expect(page.locator("#report h2")).to_have_text("Scan done")
    await wait_for(lambda: _none_left(redis, victim), within=BOUND_S)

    # Reclaim history shows the moves, with their reason.
    await page.click("header nav >> text=Reclaims")
    await expect(page.locator("#reclaims tbody tr").first).to_contain_text(victim)
    await expect(page.locator("#reclaims tbody tr").first).to_contain_text("down")
    await page.screenshot(path=screenshots / "reclaims.png", full_page=True)
    manual = page.locator("#reclaims tbody tr", has_text="manual")
    await expect(manual).to_have_count(1)
    await expect(manual).to_contain_text("by operator:")
    # Each moved entry leads to its story.
    await manual.locator("a").first.click()
    await expect(page).to_have_url(re.compile(r"/ui/work\?q="))
    await expect(page.locator("main")).to_contain_text("manual")
    await page.click("header nav >> text=Overview")
    # The dry run that measured what the operator saw first, the preview and the scan.
    await expect(page.locator("#scans tbody tr")).to_have_count(3)
    await page.screenshot(path=screenshots / "overview-after.png", full_page=True)


async def _none_left(redis: Redis, consumer: str) -> bool:
    return not await pending(redis, consumer)


async def test_a_viewer_sees_no_actions(
    browser: Browser,
    stuck: tuple[str, httpx.AsyncClient, Fleet, set[str]],
    redis: Redis,
) -> None:
    base, _, _, held = stuck
    await plant_dead_letter(redis, "rc-dead")
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, base, VIEWER)
    await expect(page.locator("header .role")).to_have_text("viewer")
    await page.goto(f"{base}/ui/deadletters")
    await expect(page.locator("#deadletters tbody tr")).to_have_count(1)
    assert await page.locator("button", has_text="Requeue").count() == 0
    assert await page.locator("button", has_text="Delete").count() == 0
    await page.goto(f"{base}/ui/pending?stream={STREAM}&group={GROUP}&consumer={VICTIM[1]}")
    await expect(page.locator("#pending tbody tr")).to_have_count(len(held))
    assert await page.locator("input[name=entries]").count() == 0
    await context.close()


async def test_a_forged_post_with_an_operators_cookie_is_refused_for_its_csrf_token(
    browser: Browser,
    stuck: tuple[str, httpx.AsyncClient, Fleet, set[str]],
    redis: Redis,
) -> None:
    """An operator's browser, whose cookie would allow the change: only the CSRF token is
    missing, and that alone refuses it."""
    base, _, _, _ = stuck
    dlq_id = await plant_dead_letter(redis, "rc-dead")
    context = await browser.new_context()
    page = await context.new_page()
    await sign_in(page, base, OPERATOR)
    await expect(page.locator("header .role")).to_have_text("operator")
    for form in (
        {"stream": STREAM, "one": dlq_id},
        {"stream": STREAM, "one": dlq_id, "csrf": "0" * 64},
        {"stream": STREAM, "all_matching": "true"},
    ):
        forged = await context.request.post(f"{base}/ui/deadletters/delete", form=form)
        assert forged.status == 403
        assert "missing or invalid CSRF token" in await forged.text()
    assert await redis.xlen(f"{STREAM}:dlq") == 1
    # The page's own form, with its token, does what the forged ones could not.
    await page.goto(f"{base}/ui/deadletters")
    page.on("dialog", lambda dialog: dialog.accept())
    await page.locator(f'tr[data-dlq-id="{dlq_id}"] button.delete-one').click()
    await expect(page.locator(".flash")).to_have_text("Done: deleted 1")
    assert await redis.xlen(f"{STREAM}:dlq") == 0
    await context.close()


async def test_the_console_works_under_a_root_path(
    browser: Browser, redis: Redis, redis_url: str, database_url: str
) -> None:
    async with serve(redis_url, database_url, **env(RIG_HTTP_ROOT_PATH="/rig")) as conductor:
        page = await browser.new_page()
        failed: list[str] = []
        page.on("requestfailed", lambda request: failed.append(request.url))
        page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
        await page.goto(f"{conductor.url}/rig/ui")
        await expect(page).to_have_url(re.compile(r"/rig/ui/login\?next=%2Frig%2Fui"))
        await page.fill("#token", OPERATOR)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(re.compile(r"/rig/ui$"))
        await expect(page.locator("#plot canvas")).to_have_count(1)  # the vendored uPlot ran
        await page.click("header nav >> text=Agents")
        await expect(page).to_have_url(re.compile(r"/rig/ui/agents$"))
        await page.click("text=Sign out")
        await expect(page).to_have_url(re.compile(r"/rig/ui/login$"))
        assert failed == []


async def test_pages_refresh_on_their_own_only_while_the_tab_is_visible(
    browser: Browser, redis: Redis, redis_url: str, database_url: str, engine: AsyncEngine
) -> None:
    """`engine` empties the tables first: no measurement of an earlier test is shown."""
    async with (
        serve(redis_url, database_url, **env()) as conductor,
        httpx.AsyncClient(
            base_url=conductor.url, headers={"Authorization": f"Bearer {AGENT}"}
        ) as api,
    ):
        page = await browser.new_page()
        polls: list[str] = []
        page.on(
            "request",
            lambda r: polls.append(r.url) if r.headers.get("hx-request") == "true" else None,
        )
        await sign_in(page, conductor.url, VIEWER)
        await expect(page.locator("#groups tbody tr")).to_have_text(re.compile("No consumer"))
        await redis.xgroup_create(STREAM, "late-group", id="0", mkstream=True)
        assert (await api.post("/api/reaper/scan", params={"dryRun": "true"})).status_code == 200
        # No reload: the live part is fetched again on its period (5 s), with what the scan
        # measured.
        await expect(page.locator("#groups")).to_contain_text("late-group")
        assert polls and "/ui" in polls[0]
        # Hidden tab: no more polling. A poll sent before it was hidden has settled first.
        await page.evaluate(
            "Object.defineProperty(document, 'visibilityState', {value: 'hidden'});"
            "document.dispatchEvent(new Event('visibilitychange'));"
        )
        await settled(page)
        before = len(polls)
        # An absence takes time to show: longer than the period, and more than one tick of
        # console.js's one-second timer.
        await page.wait_for_timeout(7_000)
        assert len(polls) == before


async def test_a_page_whose_session_ended_goes_to_sign_in_whole(
    browser: Browser, redis: Redis, redis_url: str, database_url: str
) -> None:
    """Polling after the session ended: the browser lands on the sign-in page (HX-Redirect),
    instead of the sign-in form appearing inside the live part of the old page."""
    async with serve(redis_url, database_url, **env()) as conductor:
        context = await browser.new_context()
        page = await context.new_page()
        await sign_in(page, conductor.url, VIEWER)
        await page.click("header nav >> text=Agents")
        await expect(page).to_have_url(re.compile(r"/ui/agents$"))
        await context.clear_cookies()
        await expect(page).to_have_url(re.compile(r"/ui/login\?next=%2Fui%2Fagents$"))
        await expect(page.locator("#token")).to_be_visible()
        assert await page.locator("#live").count() == 0
        await context.close()
