"""Running one handler call: plain functions in a daemon thread, `async def` on the loop, both
bounded by RIG_ENTRY_DEADLINE_MS without progress.

A handler past its deadline is abandoned: an async one is cancelled, a thread is left to
finish (nothing can stop it) with its attempt fenced, so whatever it does later does not count.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rig_conductor.agent.entry import Degraded, Entry, Handler, ProgressReporter

logger = logging.getLogger(__name__)

CANCEL_WAIT_S = 5.0  # how long an abandoned async handler may take to unwind


@dataclass(frozen=True)
class HandlerResult:
    """How a handler call ended: returned (all None/False), raised, degraded or abandoned."""

    error: str | None = None
    degraded: Degraded | None = None
    abandoned: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.degraded is None and not self.abandoned


async def call_handler(
    handler: Handler,
    entry: Entry,
    *,
    progress: ProgressReporter | None = None,
    deadline_s: float | None = None,
) -> HandlerResult:
    """Run `handler(entry)` until it returns, raises, or runs `deadline_s` past its last progress
    (`progress.last`, its start at first) without reporting any."""
    if _is_async(handler):
        work: asyncio.Future[Any] = asyncio.ensure_future(handler(entry))
    else:
        work = asyncio.ensure_future(_in_daemon_thread(handler, entry))
    try:
        while True:
            timeout = None
            if deadline_s is not None and progress is not None:
                timeout = progress.last + deadline_s - time.monotonic()
                if timeout <= 0:
                    return await _abandon(work, entry, progress, deadline_s)
            done, _ = await asyncio.wait({work}, timeout=timeout)
            if done:
                break
        result = work.result()
        if inspect.isawaitable(result):
            await result
    except Degraded as exc:
        return HandlerResult(degraded=exc)
    except Exception as exc:
        logger.warning("Handler raised on entry %s", entry.id, exc_info=True)
        return HandlerResult(error=f"{type(exc).__name__}: {exc}")
    finally:
        if not work.done():  # the runtime itself was cancelled (SIGTERM's grace ran out)
            work.cancel()
    return HandlerResult()


async def _abandon(
    work: asyncio.Future[Any], entry: Entry, progress: ProgressReporter, deadline_s: float
) -> HandlerResult:
    progress.fence()
    work.cancel()  # an async handler unwinds; a thread's future is only let go of
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(work, CANCEL_WAIT_S)
    logger.warning(
        "Abandoned entry %s (attempt %d): no progress for %.1fs; the reaper moves it elsewhere",
        entry.id,
        entry.attempt,
        deadline_s,
    )
    return HandlerResult(error=f"abandoned: no progress within {deadline_s:g}s", abandoned=True)


def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with `async def __call__`
    )


async def _in_daemon_thread(func: Callable[[Entry], Any], entry: Entry) -> Any:
    """Run a sync handler in a daemon thread. Unlike the default executor, an abandoned
    handler does not hold up the process's exit after SIGTERM's grace period."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(func, entry)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # SystemExit and friends fail the entry, not the agent
            error = RuntimeError(f"handler raised {type(exc).__name__}: {exc}")
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name=f"rig-handler-{entry.id}", daemon=True).start()
    return await future
