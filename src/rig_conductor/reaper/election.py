"""What every reaper elector shares: the `Elector` interface, the replica's identity, and the
loop, timing, leadership flag and change callback of the backends (`reaper.leader` says how they
differ and picks one)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from rig_conductor import logs

logger = logging.getLogger(logs.LEADER_LOGGER)

OnChange = Callable[[bool], Awaitable[None] | None]

DEFAULT_LEASE_NAME = "rig-conductor-reaper"
DEFAULT_LEASE_DURATION_S = 15


class Elector(Protocol):
    """Who leads: `is_leader` is true on at most one replica at a time (given sane clocks)."""

    @property
    def identity(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def trouble(self) -> str | None:
        """Why the election cannot be decided (its backend has failed every attempt for as long
        as a leader may go without renewing), else None."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def replica_identity(environ: Mapping[str, str] | None = None) -> str:
    """`<pod name>_<pid>_<random>`: HOSTNAME is the pod name in a cluster, else the host name.

    Unique to this process start: whoever holds the lease is told apart by this name alone, and
    two containers can share a host name (host networking) and a pid (both 1).
    """
    environ = os.environ if environ is None else environ
    host = environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{os.getpid()}_{secrets.token_hex(3)}"


class ElectorBase:
    """What both backends share: the loop, the timing, the flag and the change callback."""

    def __init__(
        self, *, identity: str, on_change: OnChange | None, kind: str, duration_s: float
    ) -> None:
        self._identity = identity
        self._on_change = on_change
        self._kind = kind
        self._leader = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._callbacks: set[asyncio.Future[None]] = set()
        self._expiry: asyncio.TimerHandle | None = None
        self._trouble: str | None = None
        self._failing_since: float | None = None  # monotonic time of the first failed attempt
        self.duration_s = duration_s
        self.period_s = duration_s / 3
        self.deadline_s = duration_s * 2 / 3
        self.retry_s = self.period_s / 2.5  # after a failed attempt: 2 s for a 15 s lease

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def trouble(self) -> str | None:
        since = self._failing_since
        if since is None or time.monotonic() < since + self.deadline_s:
            return None  # one failed attempt is no outage: a leader would still be leading
        return self._trouble

    def _failed(self, why: str) -> bool:
        """An attempt failed for want of the backend; True when it is the first in a row."""
        first = self._failing_since is None
        if first:
            self._failing_since = time.monotonic()
        self._trouble = why
        return first

    def _answered(self) -> bool:
        """The backend answered; True when it had failed before."""
        recovered = self._failing_since is not None
        self._failing_since = None
        self._trouble = None
        return recovered

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("elector already started")
        self._task = asyncio.create_task(self._run(), name=f"{self._kind}-elector")
        logger.info("Leader election (%s) started as %s", self._kind, self._identity)

    async def _run(self) -> None:
        """An attempt every `period_s` (`retry_s` after one the backend did not answer): leader
        while attempts succeed, each counted only when it ends within the renew deadline of
        when it began, so a slow answer never extends leadership past the lease."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            began = loop.time()
            try:
                refused = await self._claim()
            except BackendUnreachable:
                # Leadership, if any, lasts until the renew deadline timer says otherwise;
                # retry sooner so one failed renewal does not cost it.
                await self._pause(self.retry_s)
                continue
            if refused is not None:
                self._lose(refused)
            elif loop.time() < began + self.deadline_s and not self._stopping.is_set():
                self._renewed(loop, valid_until=began + self.deadline_s, why=self._holding())
            await self._pause(self.period_s)

    async def _claim(self) -> str | None:
        """One attempt on the backend: None when this replica holds the lease now, else why
        not. A backend that does not answer is counted (`_failed`) and BackendUnreachable
        raised."""
        raise NotImplementedError

    def _holding(self) -> str:
        """What this replica holds, for the log line of becoming the leader."""
        raise NotImplementedError

    # What a failed release raises (besides a timeout): the lease is then left to expire.
    _release_errors: tuple[type[Exception], ...] = ()

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing; when leading, hand the lease back so a follower need not wait it out.

        `release=False` leaves the lease to expire, as a crashed replica would.
        """
        await self._stop_task()
        was_leader = self._leader
        self._lose("stopped")
        expected: tuple[type[Exception], ...] = (*self._release_errors, TimeoutError)
        if release and was_leader:
            try:
                await asyncio.wait_for(self._release(), timeout=self._release_timeout_s())
            except expected as exc:
                logger.info(
                    "%s not released, it will expire instead: %s", self._lease(), one_line(exc)
                )
        await self._closed()

    def _lease(self) -> str:
        """The lease, as the log names it."""
        raise NotImplementedError

    async def _release(self) -> None:
        """Hand the lease back if this replica still holds it."""
        raise NotImplementedError

    def _release_timeout_s(self) -> float:
        raise NotImplementedError

    async def _closed(self) -> None:
        """Let go of what the backend keeps open between attempts (nothing, by default)."""

    async def _stop_task(self) -> None:
        """End the loop now. An attempt in flight in a worker thread may still land; that is
        safe: its write and a release race on one resourceVersion, and the loser gets a 409."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    def _set_leader(self, value: bool, why: str) -> None:
        if value == self._leader:
            return
        self._leader = value
        if value:
            logger.info("%s is now the leader (%s): %s", self._identity, self._kind, why)
        else:
            logger.warning("%s is no longer the leader (%s): %s", self._identity, self._kind, why)
        if self._on_change is None:
            return
        try:
            result = self._on_change(value)
        except Exception:
            logger.exception("Leadership change callback failed")
            return
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            self._callbacks.add(future)
            future.add_done_callback(self._callback_done)

    def _callback_done(self, future: asyncio.Future[None]) -> None:
        self._callbacks.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("Leadership change callback failed: %r", future.exception())

    def _renewed(self, loop: asyncio.AbstractEventLoop, *, valid_until: float, why: str) -> None:
        """Leader until `valid_until` (loop time) unless renewed again before."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = loop.call_at(valid_until, self._lose, "renew deadline passed")
        self._set_leader(True, why)

    def _lose(self, why: str) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._set_leader(False, why)


class BackendUnreachable(Exception):
    """An election attempt failed for want of its backend (already logged and counted)."""


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
