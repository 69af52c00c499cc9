"""A thin client for the conductor's `POST /api/events`: heartbeats and WORK_* reports.

Retries connection errors and 503 (honouring Retry-After) with backoff; turns answers into
small result objects. Decides nothing about entries: the runtime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx

from rig_conductor.agent.token_file import TokenFile
from rig_conductor.domain import AssignmentState, EventKind, StagedOutput

logger = logging.getLogger(__name__)

T = TypeVar("T")

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
RETRY_AFTER_MAX_S = 60.0
# A 429 (a client in its failed-token window, say) passes like an outage: retried, with the
# Retry-After it asks for.
_RETRYABLE = frozenset({429, 502, 503, 504})
HTTP_UNAUTHORIZED = 401


class ConductorUnavailable(Exception):
    """No answer from the conductor (connection errors, 5xx) within the retries allowed.

    `retry_after`: the wait a 5xx answer's Retry-After header asked for, if it had one.
    """

    def __init__(self, problem: str, *, retry_after: float | None = None) -> None:
        super().__init__(problem)
        self.retry_after = retry_after


class ConductorRejected(Exception):
    """The conductor refused the request itself (401, 422, ...): retrying will not help."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """A 202: WORK_STARTED's new attempt, or WORK_COMPLETED accepted for `attempt`."""

    attempt: int
    state: str


@dataclass(frozen=True, slots=True)
class FencedAnswer:
    """A 409: the entry is already `done`, or a newer attempt (`attempt`) owns it, or the
    report was refused. A done entry's `outputs` are the accepted attempt's staged files that
    are not published yet: the holder that asked publishes them."""

    attempt: int
    state: str
    detail: str
    outputs: tuple[StagedOutput, ...] = ()

    @property
    def done(self) -> bool:
        """The entry is finished: a `fenced:` answer with state `done`. A `refused:` one (the
        report did not come from the attempt's owner) says nothing of whose completion counts."""
        return self.state == AssignmentState.DONE and self.detail.startswith("fenced:")


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """A 201 to DEAD_LETTER: the conductor copied the entry to `dlq_stream` and acked it."""

    dlq_stream: str
    dlq_id: str
    deliveries: int


class ConductorClient:
    """One agent's (agentId + consumer) view of the events API.

    The bearer token is `token`, fixed, or the one `token_file` holds when each request is
    sent; a 401 makes it read the file again and, when the token there changed, try once more.
    """

    def __init__(
        self,
        *,
        base_url: str,
        agent_id: str,
        consumer: str,
        group: str | None = None,
        token: str | None = None,
        token_file: TokenFile | None = None,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if token and token_file is not None:
            raise ValueError("give a token or a token file, not both")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.agent_id = agent_id
        self.consumer = consumer
        self.group = group
        self._token_file = token_file
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def heartbeat(self, *, degraded: bool = False, reasons: Sequence[str] = ()) -> None:
        """One try: the next heartbeat is the retry."""
        body: dict[str, Any] = {"type": EventKind.HEARTBEAT, "consumer": self.consumer}
        if degraded:
            body |= {"degraded": True, "degradedReasons": list(reasons)}
        await self._post(body, tries=1)

    async def work_started(
        self, *, stream: str, entry_id: str, issue_id: str | None, tries: int = 3
    ) -> Accepted | FencedAnswer:
        body = self._work(EventKind.WORK_STARTED, stream, entry_id, issue_id)
        answer = await self._post(body, tries=tries)
        return _fenced(answer) or Accepted(int(answer.json()["attempt"]), AssignmentState.RUNNING)

    async def work_completed(
        self,
        *,
        stream: str,
        entry_id: str,
        issue_id: str | None,
        attempt: int,
        outputs: Sequence[StagedOutput] = (),
        until: asyncio.Event | None = None,
    ) -> Accepted | FencedAnswer:
        """Retries until the conductor answers, or until `until` is set (then one last try).
        `outputs`: the files the attempt staged, recorded with the completion."""
        body = self._work(EventKind.WORK_COMPLETED, stream, entry_id, issue_id, attempt=attempt)
        if outputs:
            body["outputs"] = [{"staged": o.staged, "path": o.path} for o in outputs]
        return _settled(await self._post(body, tries=None, until=until), attempt)

    async def work_progress(
        self, *, stream: str, entry_id: str, issue_id: str | None, attempt: int
    ) -> Accepted | FencedAnswer:
        body = self._work(EventKind.WORK_PROGRESS, stream, entry_id, issue_id, attempt=attempt)
        answer = await self._post(body, tries=2)
        return _fenced(answer) or Accepted(attempt, AssignmentState.RUNNING)

    async def work_failed(
        self, *, stream: str, entry_id: str, issue_id: str | None, attempt: int, error: str
    ) -> None:
        body = self._work(EventKind.WORK_FAILED, stream, entry_id, issue_id, attempt=attempt)
        body["error"] = error[:4096]
        await self._post(body, tries=3)

    async def work_published(
        self,
        *,
        stream: str,
        entry_id: str,
        issue_id: str | None,
        attempt: int,
        missing: Sequence[str] = (),
        until: asyncio.Event | None = None,
    ) -> Accepted | FencedAnswer:
        """The accepted attempt's outputs are renamed onto their paths (or, `missing`, found
        nowhere). Retries like WORK_COMPLETED: until it is recorded the entry is not acked."""
        body = self._work(EventKind.WORK_PUBLISHED, stream, entry_id, issue_id, attempt=attempt)
        if missing:
            body["missing"] = list(missing)
        return _settled(await self._post(body, tries=None, until=until), attempt)

    async def dead_letter(
        self, *, stream: str, entry_id: str, issue_id: str | None, reason: str
    ) -> DeadLettered | FencedAnswer:
        """Ask the conductor to dead-letter an entry this consumer holds (agents never write
        the dead-letter stream). A 409: the entry is done (publish, then ack) or refused."""
        body = self._work(EventKind.DEAD_LETTER, stream, entry_id, issue_id, reason=reason)
        answer = await self._post(body, tries=3)
        fenced = _fenced(answer)
        if fenced:
            return fenced
        data = answer.json()
        return DeadLettered(str(data["dlqStream"]), str(data["dlqId"]), int(data["deliveries"]))

    def _work(
        self, kind: EventKind, stream: str, entry_id: str, issue_id: str | None, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": kind,
            "consumer": self.consumer,
            "stream": stream,
            "entryId": entry_id,
            **extra,
        }
        if self.group is not None:
            body["group"] = self.group
        if issue_id:
            body["issueId"] = issue_id
        return body

    async def _post(
        self, body: dict[str, Any], *, tries: int | None, until: asyncio.Event | None = None
    ) -> httpx.Response:
        """POST one event; a 2xx or 409 answer is returned, anything else raises.

        `tries=None` retries without limit until `until` is set, then makes one last try.
        """
        body = {**body, "agentId": self.agent_id}

        def undelivered(exc: Exception, delay: float) -> None:
            logger.debug("%s not delivered (%s); retrying in %.1fs", body["type"], exc, delay)

        return await retry(
            lambda: self._post_once(body),
            retry_on=ConductorUnavailable,
            log=undelivered,
            stop=until,
            tries=tries,
            delay=_asked_wait,
        )

    async def _post_once(self, body: dict[str, Any]) -> httpx.Response:
        try:
            answer = await self._send(body)
        except httpx.TransportError as exc:
            raise ConductorUnavailable(f"{type(exc).__name__}: {exc}") from None
        if answer.is_success or answer.status_code == 409:
            return answer
        problem = f"{answer.status_code} {_detail(answer)}"
        if answer.status_code not in _RETRYABLE:
            raise ConductorRejected(problem)
        asked = retry_after(answer.headers.get("retry-after"))
        raise ConductorUnavailable(problem, retry_after=asked)

    async def _send(self, body: dict[str, Any]) -> httpx.Response:
        answer = await self._http.post("/api/events", json=body, headers=self._auth())
        if (
            answer.status_code == HTTP_UNAUTHORIZED
            and self._token_file is not None
            and self._token_file.refresh()
        ):
            # Rotated since the last stat (or a refusal that a newer token answers): once more.
            answer = await self._http.post("/api/events", json=body, headers=self._auth())
        return answer

    def _auth(self) -> dict[str, str] | None:
        if self._token_file is None:
            return None
        return {"Authorization": f"Bearer {self._token_file.current()}"}


async def retry(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    log: Callable[[Exception, float], object] = lambda exc, seconds: None,
    stop: asyncio.Event | None = None,
    tries: int | None = None,
    delay: Callable[[Exception, int], float | None] = lambda exc, n: None,
) -> T:
    """The agent's one retry loop: `call()` until it returns.

    After its n-th failure of a kind in `retry_on`: `log(failure, seconds)`, then a wait of
    `delay(failure, n)` or, when that is None or 0, `backoff(n)`, cut short when `stop` is set.
    The failure is raised instead when the call that failed was the last one: the `tries`-th, or
    one begun after `stop` was set (so a stop during a wait still gets one last try).
    """
    attempt = 0
    while True:
        attempt += 1
        last = (tries is not None and attempt >= tries) or (stop is not None and stop.is_set())
        try:
            return await call()
        except retry_on as exc:
            if last:
                raise
            seconds = delay(exc, attempt) or backoff(attempt)
            log(exc, seconds)
            await pause(seconds, stop)


def _asked_wait(exc: Exception, attempt: int) -> float | None:
    return exc.retry_after if isinstance(exc, ConductorUnavailable) else None


async def pause(seconds: float, until: asyncio.Event | None = None) -> None:
    """Wait before a retry; cut short when `until` is set."""
    if until is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until.wait(), seconds)


def _settled(answer: httpx.Response, attempt: int) -> Accepted | FencedAnswer:
    """The answer to a completion or a publish: fenced (409), or accepted with the state the
    conductor now holds for the entry (`done` when it does not say)."""
    fenced = _fenced(answer)
    if fenced:
        return fenced
    data = answer.json()
    state = str(data.get("state", AssignmentState.DONE))
    return Accepted(int(data.get("attempt", attempt)), state)


def _fenced(answer: httpx.Response) -> FencedAnswer | None:
    if answer.status_code != 409:
        return None
    data = answer.json()
    outputs = tuple(
        StagedOutput(str(item["staged"]), str(item["path"]))
        for item in data.get("outputs") or ()
        if isinstance(item, dict) and "staged" in item and "path" in item
    )
    return FencedAnswer(
        int(data["attempt"]), str(data["state"]), str(data.get("detail", "")), outputs
    )


def _detail(answer: httpx.Response) -> str:
    try:
        return str(answer.json().get("detail", ""))[:200]
    except ValueError:
        return answer.text[:200]


def backoff(attempt: int) -> float:
    """Exponential from 0.5 s up to 10 s, with jitter so a fleet does not retry in step."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date), capped."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX_S)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = (when - (now or datetime.now(UTC))).total_seconds()
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)
