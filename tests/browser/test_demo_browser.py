"""`rig-conductor demo` in a browser while it runs, as a newcomer meets it: the console it
prints shows builder-b's consumers losing their builds to builder-a live (the page is never
reloaded), the summary on stdout agrees with the API at that moment, and afterwards the
console keeps a live fleet (builder-a and builder-c up, new work pending and done) until
Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, Page, expect

from rig_conductor import demo

from .conftest import settled

pytestmark = pytest.mark.timeout(360)

SUMMARY = re.compile(
    r"Demo done: (?P<done>\d+) of (?P<issues>\d+) issues completed, all by (?P<by>\S+); "
    r"(?P<reclaimed>\d+) reclaimed from builder-b\. Pending now: (?P<pending>\{.*\})"
)
STOPPED = re.compile(
    r"Demo stopped: (?P<done>\d+) of (?P<issues>\d+) issues completed; "
    r"(?P<reclaimed>\d+) reclaimed from builder-b\. Pending now: (?P<pending>\{.*\})"
)


def line_matching(
    out: Path, pattern: re.Pattern[str], process: subprocess.Popen[bytes], err: Path
) -> re.Match[str]:
    """The first line of the demo's stdout matching `pattern`, waited for (bounded)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in out.read_text(errors="replace").splitlines():
            if found := pattern.fullmatch(line):
                return found
        if process.poll() is not None:
            raise AssertionError(f"demo exited with {process.returncode}: {err.read_text()}")
        time.sleep(0.1)
    raise AssertionError(f"the demo printed no line matching {pattern.pattern}")


def summary_and_figures(
    out: Path, process: subprocess.Popen[bytes], err: Path, base: str
) -> tuple[re.Match[str], dict[str, int], int]:
    """The summary line and, read the moment it appears, the API's pending per group and
    reclaimed count (the new work starts seconds after it)."""
    summary = line_matching(out, SUMMARY, process, err)
    with httpx.Client(base_url=base, timeout=10) as api:
        streams = api.get("/api/streams").json()
        metrics = api.get("/metrics").text
    return summary, {g["group"]: g["pending"] for g in streams}, reclaimed_total(metrics)


def reclaimed_total(metrics: str) -> int:
    found = re.findall(r"^rig_reclaimed_entries_total\{.*\} (\S+)$", metrics, re.MULTILINE)
    return int(sum(float(value) for value in found))


async def live_work_seen(page: Page, url: str) -> str:
    """Reload the group's page until a live builder holds an entry: work moving after the
    story. Returns the consumer seen holding it."""
    live = (demo.LIVE[1], demo.HELPER[1])
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline:
        await page.goto(f"{url}/group?stream={demo.STREAM}&name={demo.GROUP}")
        for consumer in live:
            row = page.locator(f'#consumers tr[data-consumer="{consumer}"]')
            if await row.count() and (await row.locator("td.pending").inner_text()) == "1":
                await expect(row.locator(".state")).to_have_text("up")
                return consumer
        await asyncio.sleep(0.2)
    raise AssertionError("no live builder was seen holding new work within 45 s")


async def test_the_demo_keeps_a_live_console_until_ctrl_c(
    browser: Browser, tmp_path: Path, screenshots: Path
) -> None:
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
            [sys.executable, "-m", "rig_conductor", "demo", "--watch", "--timeout", "90"],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        console = await asyncio.to_thread(
            line_matching, out, re.compile(r"Console: (http://\S+/ui)"), process, err
        )
        url = console.group(1)
        base = url.removesuffix("/ui")
        # Watched beside the browser, so the API is read when the summary appears.
        figures = asyncio.create_task(
            asyncio.to_thread(summary_and_figures, out, process, err, base)
        )
        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        await page.goto(f"{url}/reclaims")  # no tokens in the demo: no sign-in
        await settled(page)
        await expect(page.locator("#reclaims")).to_contain_text("No reclaims")
        rows = page.locator("#reclaims tbody tr", has_text=demo.DOOMED_AGENT)
        await expect(rows.first).to_be_visible(timeout=60_000)  # arrives without a reload
        # Every build ends with builder-a. builder-b's consumers turn down up to a heartbeat
        # apart (more on a loaded machine): a scan in between may first move one's entry to
        # another builder-b consumer, still alive by its evidence (rule 5), and a later scan
        # moves it on. So: as many moves to builder-a as doomed builds, every move `down`.
        to_live = rows.filter(has_text=demo.LIVE[1])
        await expect(to_live).to_have_count(len(demo.DOOMED), timeout=90_000)
        for row in await rows.all_inner_texts():
            assert "down" in row, row

        # The summary agrees with the API's figures of that moment.
        summary, pending, reclaimed_then = await figures
        assert json.loads(summary["pending"]) == pending
        assert int(summary["reclaimed"]) == reclaimed_then >= len(demo.DOOMED)
        assert summary["done"] == summary["issues"] == str(len(demo.ISSUES))

        # A live fleet afterwards: builder-a and builder-c up, builder-b down; new work moving.
        await page.goto(f"{url}/agents")
        for agent, state in ((demo.LIVE[0], "up"), (demo.HELPER[0], "up"), ("builder-b", "down")):
            row = page.locator("#agents tbody tr", has_text=agent)
            await expect(row.locator(".state")).to_have_text(state, timeout=20_000)
        await page.screenshot(path=screenshots / "demo-agents.png", full_page=True)
        await live_work_seen(page, url)
        await page.screenshot(path=screenshots / "demo-group.png", full_page=True)
        await page.goto(url)
        await settled(page)
        scans = page.locator("#scans tbody tr", has_text="scan")
        await expect(scans.nth(2)).to_be_visible(timeout=30_000)
        reclaimed = await page.evaluate(
            "() => JSON.parse(document.querySelector('script.series').textContent).reclaimed"
        )
        assert sum(reclaimed) == reclaimed_then, reclaimed
        await expect(page.locator("#plot canvas")).to_have_count(1)
        await page.screenshot(path=screenshots / "demo-overview.png", full_page=True)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(process.wait, 60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert process.returncode == 0, err.read_text()[-3000:]
    last = out.read_text().splitlines()[-1]
    stopped = STOPPED.fullmatch(last)
    assert stopped, last
    assert int(stopped["issues"]) > len(demo.ISSUES)  # work went on after the story
    assert int(stopped["reclaimed"]) >= len(demo.DOOMED)
    assert err.read_text().count("[StreamReclaim] Reclaimed") >= len(demo.DOOMED)
