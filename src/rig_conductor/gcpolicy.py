"""Cyclic garbage collector settings for the long-running `serve` process.

CPython's defaults cost a server that keeps requests suspended across awaits (each heartbeat
waits for its group commit) in two ways:

- The youngest generation is collected once tracked allocations outnumber deallocations by
  700. With a few dozen requests in flight, more young objects than that are alive at any
  moment, so the collector runs every few requests and walks the live request state each time:
  about 7% of the CPU at 2,500 heartbeats/s (timed with `gc.callbacks`). Above the in-flight
  population, allocations and deallocations balance and the youngest generation rarely fills.
- A full collection walks every long-lived object loaded at start-up (FastAPI, pydantic, the
  Kubernetes client): tens of milliseconds each, paid by whichever requests are waiting. Frozen
  after start-up (`gc.freeze`), those objects are skipped from then on.

A reaper sweep is the opposite case: it builds hundreds of thousands of small objects a second
(a row per pending entry read, the ids claimed, the log lines), nearly all freed by reference
counting within one page, while the pages in flight and everything loaded at start-up are
alive. The collector, triggered by the allocations, would walk that live state again and again:
half the conductor's CPU in a 200,000-entry scan. A sweep runs with automatic collection
`paused`; what little cyclic garbage it leaves is collected at the next collection after it.

Reference counting frees almost everything either way; these settings only decide how often the
cycle collector looks, and at what.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

YOUNG_THRESHOLD = 10_000  # CPython's default is 700


def loaded() -> None:
    """Freeze what start-up loaded (modules, classes, settings): the collector skips it from
    now on, also in the full collections of the interpreter's exit (150 ms of a `reap --once`
    run are spent walking it there otherwise)."""
    gc.freeze()


def after_startup() -> None:
    """Collect once, freeze what survives, and raise the youngest generation's threshold."""
    gc.collect()
    loaded()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), older, oldest)


_pauses = 0  # sweeps under way: the collector resumes when the last one ends
_was_enabled = True


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic cycle collection while the block runs. Blocks may overlap (sweeps of several
    groups at once, on one event loop): the collector resumes as it was when the last one ends."""
    global _pauses, _was_enabled
    if _pauses == 0:
        _was_enabled = gc.isenabled()
        gc.disable()
    _pauses += 1
    try:
        yield
    finally:
        _pauses -= 1
        if _pauses == 0 and _was_enabled:
            gc.enable()
