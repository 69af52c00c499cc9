"""CI cannot pass by skipping: .ci/run sets CI, under which a missing browser (or podman, or a
second Redis) fails the run; and the screenshots it lists are this run's. CI also takes the
newcomer's path: the README's `make test` with no servers configured."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import needs
from tests.browser import conftest as browser

RUN = Path(__file__).resolve().parents[2] / ".ci" / "run"


# The README's test command, run with no RIG_TEST_* servers: embedded Redis and PostgreSQL.
MAKE_TEST = r"env -u RIG_TEST_REDIS_URL -u RIG_TEST_DATABASE_URL make test$"
README = RUN.parents[1] / "README.md"


def lines() -> list[str]:
    return [line.strip() for line in RUN.read_text().splitlines()]


def first(pattern: str) -> int:
    return next(i for i, line in enumerate(lines()) if re.match(pattern, line))


def test_ci_run_sets_ci_before_any_test_runs() -> None:
    assert first(r"export CI=1$") < first(r"make lint typecheck") < first(MAKE_TEST)


def test_ci_run_lists_only_this_runs_screenshots_and_needs_some() -> None:
    clear = first(r'rm -rf "\$RIG_ARTIFACTS_DIR/screenshots"$')
    assert first(r"export RIG_ARTIFACTS_DIR=") < clear < first(MAKE_TEST)
    listing = first(r'ls "\$RIG_ARTIFACTS_DIR/screenshots"$')
    assert listing > first(MAKE_TEST)
    assert re.match(r'\[\[ -n "\$\(ls -A "\$RIG_ARTIFACTS_DIR/screenshots"\)" \]\]', lines()[-1])


def test_ci_runs_the_readmes_test_command_with_no_servers_configured() -> None:
    newcomer = first(MAKE_TEST)
    configured = [i for i, line in enumerate(lines()) if re.match(r"(export )?RIG_TEST_", line)]
    assert configured and min(configured) > newcomer, "RIG_TEST_* must not be set before it"
    assert "make test " in README.read_text()  # the README's command is that one


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
