"""Scans asked for through the API or the console, coalesced: requests share scans.

A request that arrives while no scan of its lane is queued queues one (it starts once the
lane's previous scan is over); every request that arrives before that scan starts shares it
and its report. So each request gets the report of a scan that started after it arrived,
the scans of a lane never run side by side, and a flood of K requests costs at most two
scans, not K. Whether a scan is kept among the last scans is the wish of any of its
requesters (`remember`).

A requester that gives up (a client that hung up) does not cancel the scan others share.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Queued(Generic[T]):
    remember: bool
    task: asyncio.Task[T] = field(init=False)


class Lane(Generic[T]):
    """One kind of requested scan (`run(remember)` does one); `ask` shares or queues one."""

    def __init__(self, run: Callable[[bool], Awaitable[T]]) -> None:
        self._run = run
        self._queued: _Queued[T] | None = None  # not started yet: new requests join it
        self._last: asyncio.Task[T] | None = None  # the latest scan, started or queued

    async def ask(self, *, remember: bool = True) -> T:
        queued = self._queued
        if queued is None:
            queued = self._queued = _Queued(remember)
            queued.task = asyncio.ensure_future(self._after(self._last, queued))
            queued.task.add_done_callback(_retrieved)
            self._last = queued.task
        else:
            queued.remember = queued.remember or remember
        return await asyncio.shield(queued.task)

    async def wait(self) -> None:
        """Until the lane's scans, queued ones too, are over (for shutting down)."""
        while (last := self._last) is not None and not last.done():
            await asyncio.wait([last])

    async def _after(self, previous: asyncio.Task[T] | None, queued: _Queued[T]) -> T:
        if previous is not None and not previous.done():
            await asyncio.wait([previous])  # its outcome is its own requesters'
        self._queued = None  # started: the next request queues the next scan
        return await self._run(queued.remember)


def _retrieved(task: asyncio.Task[object]) -> None:
    """A scan whose requesters all gave up still has its error looked at (no asyncio warning);
    the scan itself logged it."""
    if not task.cancelled():
        task.exception()
