"""`rig-conductor demo --watch` in a browser: the console it prints shows builder-b's consumers
holding their builds, then the reclaim to builder-a arriving in the reclaim history, live (the
page is never reloaded)."""

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
from playwright.async_api import Browser, expect

from rig_conductor import demo

from .conftest import settled

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
        # It arrives without a reload, once the demo's agent has been down for its threshold
        # and a scan has seen it (the demo gives up after --timeout 90).
        await expect(rows.first).to_be_visible(timeout=120_000)
        await expect(rows).to_have_count(len(demo.DOOMED))
        for n in range(len(demo.DOOMED)):
            await expect(rows.nth(n)).to_contain_text(demo.LIVE[1])
            await expect(rows.nth(n)).to_contain_text("down")
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
        assert sum(reclaimed) == len(demo.DOOMED), reclaimed
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
    assert output.count("[StreamReclaim] Reclaimed") == len(demo.DOOMED), output[-3000:]
