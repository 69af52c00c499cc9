"""Log lines about refused requests at a bounded rate, per reason.

A flood of refused requests (wrong tokens, a bound agent speaking for others, names that are
not names) must not become a flood of log lines: each reason logs at most `per_window` lines
per `window_s`; the rest are counted, and the next line of that reason after the window says
how many were left out (`<reason>: N more like this suppressed in the last S s`). Nothing here
decides whether a request is refused, and nothing is dropped from the event log or the
metrics: only the log lines are bounded.

Pure bookkeeping over a clock, touched from the event loop only.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PER_WINDOW = 10
WINDOW_S = 60.0
MAX_REASONS = 1_000  # reasons are a fixed vocabulary; this only bounds a mistake


@dataclass(slots=True)
class _Window:
    started: float
    logged: int = 0
    suppressed: int = 0


class RateLimitedLog:
    """`log(logger, level, reason, msg, *args, **kwargs)`: `logger.log` unless `reason` has had
    its lines for this window. One per app (`app.state.refusal_log`), so each app counts apart.
    """

    def __init__(
        self,
        *,
        per_window: int = PER_WINDOW,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_window = per_window
        self.window_s = window_s
        self.clock = clock
        self._windows: OrderedDict[str, _Window] = OrderedDict()

    def log(
        self, logger: logging.Logger, level: int, reason: str, msg: str, *args: Any, **kwargs: Any
    ) -> bool:
        """Log the line, or count it as suppressed; True when it was logged."""
        if not logger.isEnabledFor(level):
            return False
        now = self.clock()
        window = self._windows.get(reason)
        if window is None or now - window.started >= self.window_s:
            if window is not None and window.suppressed:
                _summary(logger, level, reason, window, now)
            window = _Window(now)
            self._windows[reason] = window
            self._windows.move_to_end(reason)
            while len(self._windows) > MAX_REASONS:
                self._windows.popitem(last=False)
        if window.logged >= self.per_window:
            window.suppressed += 1
            return False
        window.logged += 1
        logger.log(level, msg, *args, **kwargs)
        return True


def _summary(logger: logging.Logger, level: int, reason: str, window: _Window, now: float) -> None:
    seconds = now - window.started
    logger.log(
        level,
        "%s: %d more like this suppressed in the last %.0f s",
        reason,
        window.suppressed,
        seconds,
        extra={"reason": reason, "suppressed": window.suppressed},
    )
