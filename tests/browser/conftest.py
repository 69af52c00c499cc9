"""A real headless Chromium (Debian's `chromium` package) driven by Playwright.

Nothing is downloaded: Playwright launches the system browser by path (`RIG_TEST_CHROMIUM`,
else `chromium` on PATH). Off CI a machine without it skips these tests; with `CI` set they
fail instead, so CI never passes by skipping the browser. Screenshots go to
`RIG_ARTIFACTS_DIR` (default `.artifacts/`), which CI keeps.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, async_playwright

from tests import needs

REPO = Path(__file__).resolve().parents[2]


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
