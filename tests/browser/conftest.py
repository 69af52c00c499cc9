"""A real headless Chromium (Debian's `chromium` package) driven by Playwright.

Nothing is downloaded: Playwright launches the system browser by path (`RIG_TEST_CHROMIUM`,
else `chromium` on PATH). Off CI a machine without it skips these tests; with `CI` set they
fail instead, so CI never passes by skipping the browser. Screenshots go to
`RIG_ARTIFACTS_DIR` (default `.artifacts/`), which CI keeps.

The tests wait on conditions, never on a time: the state they check is in place first (through
the API or the database), then the page, once it says it is ready (`settled`). Every `expect`
is bounded by BOUND_MS, long enough that only a fault reaches it on a loaded machine.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests import needs

REPO = Path(__file__).resolve().parents[2]
# The bound of every `expect` (Playwright's own default, 5 s, is a measure of speed on a quiet
# machine): a condition met in time on a quiet one can take several times longer on a loaded one.
BOUND_MS = 45_000
BOUND_S = BOUND_MS / 1000  # the same, for wait_for
expect.set_options(timeout=BOUND_MS)


async def settled(page: Page) -> None:
    """Until the page says it is ready: drawn, and htmx settled with nothing in flight
    (console.js sets `data-ready` on <body>)."""
    await expect(page.locator("body[data-ready]")).to_have_count(1)


def chromium_path() -> str:
    found = os.environ.get("RIG_TEST_CHROMIUM") or shutil.which("chromium")
    if not found:
        needs.missing("no chromium on PATH (apt-get install chromium) and RIG_TEST_CHROMIUM unset")
    return found


@pytest.fixture(scope="session")
def screenshots() -> Path:
    folder = Path(os.environ.get("RIG_ARTIFACTS_DIR", REPO / ".artifacts")) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    path = chromium_path()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=path, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            await launched.close()
