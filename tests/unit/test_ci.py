"""CI cannot pass by skipping: .ci/run sets CI, under which a missing browser (or podman, or a
second Redis) fails the run; and the screenshots it lists are this run's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import needs
from tests.browser import conftest as browser

RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


def lines() -> list[str]:
    return [line.strip() for line in RUN.read_text().splitlines()]


def first(pattern: str) -> int:
    return next(i for i, line in enumerate(lines()) if re.match(pattern, line))


def test_ci_run_sets_ci_before_any_test_runs() -> None:
    assert first(r"export CI=1$") < first(r"make lint typecheck") < first(r"make test$")


def test_ci_run_lists_only_this_runs_screenshots_and_needs_some() -> None:
    clear = first(r'rm -rf "\$RIG_ARTIFACTS_DIR/screenshots"$')
    assert first(r"export RIG_ARTIFACTS_DIR=") < clear < first(r"make test$")
    listing = first(r'ls "\$RIG_ARTIFACTS_DIR/screenshots"$')
    assert listing > first(r"make test$")
    assert re.match(r'\[\[ -n "\$\(ls -A "\$RIG_ARTIFACTS_DIR/screenshots"\)" \]\]', lines()[-1])


def test_a_missing_prerequisite_skips_off_ci_and_fails_on_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        needs.missing("no browser")
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        needs.missing("no browser")


def test_without_chromium_the_browser_tests_fail_on_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RIG_TEST_CHROMIUM", raising=False)
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="no chromium"):
        browser.chromium_path()
