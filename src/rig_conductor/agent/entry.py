"""What a handler sees and may raise: the `Entry`, `entry.progress()`, `Fenced` and `Degraded`.

Also the two small decisions the runtime makes about an entry before any handler runs: the
consumer name it reads with, and the triage of an entry just read.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from rig_conductor.agent import staging

DEGRADED_PAUSE_S = 60.0  # a Degraded without `until` pauses reading this long
PROGRESS_WAIT_S = 30.0  # how long a sync handler's progress() waits for the conductor


class Fenced(Exception):
    """Raised by `entry.progress()` when a newer attempt owns the entry (the reaper moved it, or
    the runtime abandoned this attempt at its deadline): stop, nothing this attempt does counts."""


class Degraded(Exception):
    """Raise from a handler when the agent cannot serve work now (a provider's quota, a 429).

    The entry stays pending; the agent heartbeats `degraded: true` with `reason` and reads
    nothing until `until` (a datetime; 60 s from now when None). Its entries go to healthy
    consumers once the conductor's grace period has passed (reaper rule 3b, docs/rules.md).
    """

    def __init__(self, reason: str, until: datetime | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.until = until

    def pause_s(self, now: datetime | None = None) -> float:
        """Seconds to read nothing: until `until`, or the default pause."""
        if self.until is None:
            return DEGRADED_PAUSE_S
        until = self.until if self.until.tzinfo else self.until.replace(tzinfo=UTC)
        return max(0.0, (until - (now or datetime.now(UTC))) / timedelta(seconds=1))


class _Done:
    """An awaitable that is already finished: what a sync handler's progress() returns."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


class ProgressReporter:
    """Sends WORK_PROGRESS for one attempt and keeps the time of the last sign of progress, which
    the runtime's deadline counts from. Works from the event loop and from a handler's thread."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[], Coroutine[Any, Any, bool]],
    ) -> None:
        self._loop = loop
        self._send = send  # True when accepted, False when fenced
        self.last = time.monotonic()
        self.fenced = False

    def fence(self) -> None:
        """The runtime gave this attempt up: from now on progress() raises Fenced."""
        self.fenced = True

    async def report(self) -> None:
        if self.fenced:
            raise Fenced("this attempt was abandoned or fenced off")
        self.last = time.monotonic()
        if not await self._send():
            self.fenced = True
            raise Fenced("a newer attempt owns this entry")

    def call(self) -> Awaitable[None]:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return self.report()
        future = asyncio.run_coroutine_threadsafe(self.report(), self._loop)
        future.result(timeout=PROGRESS_WAIT_S)
        return _Done()


@dataclass(frozen=True)
class Entry:
    """One stream entry as a handler sees it, for one attempt."""

    id: str
    stream: str
    group: str
    consumer: str
    attempt: int
    fields: dict[str, str]
    _staging: staging.Staging | None = field(default=None, repr=False, compare=False)
    _progress: ProgressReporter | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._staging is None:
            area = staging.Staging(entry_id=self.id, attempt=self.attempt)
            object.__setattr__(self, "_staging", area)

    @property
    def issue_id(self) -> str | None:
        return self.fields.get("issueId")

    def stage(self, path: str | os.PathLike[str]) -> Path:
        """A temporary path beside `path` to write to; renamed onto `path` once the conductor
        accepts this attempt's completion, removed if the attempt is fenced off or fails."""
        assert self._staging is not None
        return self._staging.stage(path)

    def progress(self) -> Awaitable[None]:
        """Report progress (WORK_PROGRESS): the entry keeps its deadline (rule 4b, docs/rules.md).

        Call it from the loop that does long work. In a sync handler it reports before it
        returns; in an async handler, await it. Raises `Fenced` when a newer attempt owns the
        entry. The runtime never reports progress on its own: a hung handler must look hung.
        """
        if self._progress is None:
            return _Done()  # an Entry built by hand, outside the runtime
        return self._progress.call()


Handler = Callable[[Entry], Any]


def consumer_name(agent_id: str, environ: Mapping[str, str] | None = None) -> str:
    """CONSUMER_ID, else HOSTNAME (the pod name), else `<agent-id>-<uuid>` made now.

    Never a constant: two processes sharing a name would share one pending list. The UUID
    fallback keeps the agent id as a prefix, so the reaper can resolve it to its agent.
    """
    env = os.environ if environ is None else environ
    for variable in ("CONSUMER_ID", "HOSTNAME"):
        value = env.get(variable, "").strip()
        if value:
            return value
    return f"{agent_id}-{uuid.uuid4()}"


Triage = Literal["trimmed", "max-deliveries", "handle"]


def triage(fields: Mapping[str, str], *, deliveries: int, max_deliveries: int) -> Triage:
    """What to do with an entry just read. `deliveries` counts the read that returned it.

    An entry with no fields was deleted or trimmed from the stream (Redis still lists it as
    pending). Otherwise the count before this read decides, as the reaper's rule does.
    """
    if not fields:
        return "trimmed"
    if deliveries - 1 >= max_deliveries:
        return "max-deliveries"
    return "handle"
