"""Refusal lines at a bounded rate per reason, with a count of what was left out: a table of
events over a clock the test drives."""

from __future__ import annotations

import logging

import pytest

from rig_conductor.lograte import RateLimitedLog

logger = logging.getLogger("rig_conductor.test_lograte")


def test_each_reason_logs_its_share_per_window_then_says_how_many_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=logger.name)
    now = [0.0]
    log = RateLimitedLog(per_window=2, window_s=10, clock=lambda: now[0])
    logged = [log.log(logger, logging.WARNING, "a", "a %d", n) for n in range(5)]
    assert logged == [True, True, False, False, False]
    assert log.log(logger, logging.WARNING, "b", "b %d", 0)  # another reason counts apart
    now[0] = 9.9
    assert not log.log(logger, logging.WARNING, "a", "a %d", 5)
    now[0] = 10.0
    assert log.log(logger, logging.WARNING, "a", "a %d", 6)
    assert [r.getMessage() for r in caplog.records] == [
        "a 0",
        "a 1",
        "b 0",
        "a: 4 more like this suppressed in the last 10 s",
        "a 6",
    ]
    assert caplog.records[3].suppressed == 4  # type: ignore[attr-defined]


def test_a_quiet_window_needs_no_summary(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=logger.name)
    now = [0.0]
    log = RateLimitedLog(per_window=2, window_s=10, clock=lambda: now[0])
    log.log(logger, logging.INFO, "a", "first")
    now[0] = 30.0
    log.log(logger, logging.INFO, "a", "second")
    assert [r.getMessage() for r in caplog.records] == ["first", "second"]


def test_a_level_nobody_logs_costs_no_window() -> None:
    log = RateLimitedLog(per_window=1)
    assert not log.log(logger, logging.DEBUG - 5, "a", "never")
    assert log._windows == {}
