"""`rig-conductor demo --watch` in a browser: the console it prints shows builder-b's consumers
holding their builds, then the reclaim to builder-a arriving in the reclaim history, live (the
page is never reloaded).

builder-b's consumers die together, but their last heartbeats are up to a heartbeat interval
apart (more on a loaded machine): a scan that falls between the moments they turn down may
move one's entry to another builder-b consumer, still alive by its evidence (rule 5), and a
later scan moves it on to builder-a. So the test asks that every build ends with builder-a,
each move with reason `down`, not that each goes there in one move."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.async_api import Browser, Locator, expect

from rig_conductor import demo
from tests.integration.helpers import wait_for

from .conftest import settled

RECLAIMED = re.compile(r"\[StreamReclaim\] Reclaimed \S+ on \S+: (\S+) -> (\S+)")

pytestmark = pytest.mark.timeout(240)


def console_url(log: Path, process: subprocess.Popen[bytes], within: float = 90) -> str:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        found = re.search(r"Console: (http://\S+/ui) ", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        if process.poll() is not None:
            raise AssertionError(f"demo exited with {process.returncode}: {log.read_text()}")
        time.sleep(0.2)
    raise AssertionError("demo printed no console URL")


async def test_the_demo_shows_the_reclaim_live_in_the_console(
    browser: Browser, tmp_path: Path, screenshots: Path
) -> None:
    log = tmp_path / "demo.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    with log.open("wb") as sink:
        process = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited
            [sys.executable, "-m", "rig_conductor", "demo", "--watch", "--timeout", "90"],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        url = await asyncio.to_thread(console_url, log, process)
        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        await page.goto(f"{url}/reclaims")  # no tokens in the demo: no sign-in
        await settled(page)
        await expect(page.locator("#reclaims")).to_contain_text("No reclaims")
        rows = page.locator("#reclaims tbody tr", has_text=demo.DOOMED_AGENT)
        to_live = rows.filter(has=page.locator("td:nth-child(4)", has_text=demo.LIVE[1]))
        # It arrives without a reload, once the demo's agent has been down for its threshold
        # and a scan has seen it (the demo gives up after --timeout 90).
        await expect(to_live.first).to_be_visible(timeout=120_000)

        async def moved(where: Locator) -> int:
            return sum(map(int, await where.locator("td.num").all_inner_texts()))

        async def every_build_with_builder_a() -> bool:
            return await moved(to_live) == len(demo.DOOMED)

        await wait_for(every_build_with_builder_a, within=90, explain=rows.all_inner_texts)
        for row in await rows.all_inner_texts():
            assert "down" in row, row
        entries_moved = await moved(rows)
        # The overview: the scans so far, the reclaims among them, and the plot of both (the
        # README's picture of the console).
        await page.goto(url)
        await settled(page)
        scans = page.locator("#scans tbody tr", has_text="scan")
        await expect(scans.nth(2)).to_be_visible()
        await expect(page.locator("#scans tbody")).to_contain_text("down")
        reclaimed = await page.evaluate(
            "() => JSON.parse(document.querySelector('script.series').textContent).reclaimed"
        )
        assert sum(reclaimed) == entries_moved, reclaimed
        await expect(page.locator("#plot canvas")).to_have_count(1)
        await page.screenshot(path=screenshots / "demo-overview.png", full_page=True)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    output = log.read_text(errors="replace")
    moves = RECLAIMED.findall(output)
    assert len(moves) == entries_moved, output[-3000:]
    assert all(source in demo.DOOMED for source, _ in moves), moves
    assert sum(target == demo.LIVE[1] for _, target in moves) == len(demo.DOOMED), moves
