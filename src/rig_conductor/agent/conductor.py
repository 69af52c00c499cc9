"""A thin client for the conductor's `POST /api/events`: heartbeats and WORK_* reports.

Retries connection errors and 503 (honouring Retry-After) with backoff; turns answers into
small result objects. Decides nothing about entries: the runtime does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from rig_conductor.agent.token_file import TokenFile

logger = logging.getLogger(__name__)

BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 10.0
RETRY_AFTER_MAX_S = 60.0
_RETRYABLE = frozenset({502, 503, 504})
HTTP_UNAUTHORIZED = 401


class ConductorUnavailable(Exception):
    """No answer from the conductor (connection errors, 5xx) within the retries allowed."""


class ConductorRejected(Exception):
    """The conductor refused the request itself (401, 422, ...): retrying will not help."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """A 202: WORK_STARTED's new attempt, or WORK_COMPLETED accepted for `attempt`."""

    attempt: int
    state: str


@dataclass(frozen=True, slots=True)
class FencedAnswer:
    """A 409: the entry is already `done`, or a newer attempt (`attempt`) owns it."""

    attempt: int
    state: str
    detail: str

    @property
    def done(self) -> bool:
        return self.state == "done"


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
        self._token_file = token_file
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def heartbeat(self, *, degraded: bool = False, reasons: Sequence[str] = ()) -> None:
        """One try: the next heartbeat is the retry."""
        body: dict[str, Any] = {"type": "HEARTBEAT", "consumer": self.consumer}
        if degraded:
            body |= {"degraded": True, "degradedReasons": list(reasons)}
        await self._post(body, tries=1)

    async def work_started(
        self, *, stream: str, entry_id: str, issue_id: str | None, tries: int = 3
    ) -> Accepted | FencedAnswer:
        body = self._work("WORK_STARTED", stream, entry_id, issue_id)
        answer = await self._post(body, tries=tries)
        return _fenced(answer) or Accepted(int(answer.json()["attempt"]), "running")

    async def work_completed(
        self,
        *,
        stream: str,
        entry_id: str,
        issue_id: str | None,
        attempt: int,
        until: asyncio.Event | None = None,
    ) -> Accepted | FencedAnswer:
        """Retries until the conductor answers, or until `until` is set (then one last try)."""
        body = self._work("WORK_COMPLETED", stream, entry_id, issue_id, attempt=attempt)
        answer = await self._post(body, tries=None, until=until)
        fenced = _fenced(answer)
        if fenced:
            return fenced
        data = answer.json()
        return Accepted(int(data.get("attempt", attempt)), str(data.get("state", "done")))

    async def work_progress(
        self, *, stream: str, entry_id: str, issue_id: str | None, attempt: int
    ) -> Accepted | FencedAnswer:
        body = self._work("WORK_PROGRESS", stream, entry_id, issue_id, attempt=attempt)
        answer = await self._post(body, tries=2)
        return _fenced(answer) or Accepted(attempt, "running")

    async def work_failed(
        self, *, stream: str, entry_id: str, issue_id: str | None, attempt: int, error: str
    ) -> None:
        body = self._work("WORK_FAILED", stream, entry_id, issue_id, attempt=attempt)
        body["error"] = error[:4096]
        await self._post(body, tries=3)

    def _work(
        self, kind: str, stream: str, entry_id: str, issue_id: str | None, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": kind,
            "consumer": self.consumer,
            "stream": stream,
            "entryId": entry_id,
            **extra,
        }
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
        attempt = 0
        while True:
            attempt += 1
            last = (tries is not None and attempt >= tries) or (
                until is not None and until.is_set()
            )
            try:
                answer = await self._send(body)
            except httpx.TransportError as exc:
                problem, delay = f"{type(exc).__name__}: {exc}", backoff(attempt)
            else:
                if answer.is_success or answer.status_code == 409:
                    return answer
                if answer.status_code not in _RETRYABLE:
                    raise ConductorRejected(f"{answer.status_code} {_detail(answer)}")
                problem = f"{answer.status_code} {_detail(answer)}"
                delay = retry_after(answer.headers.get("retry-after")) or backoff(attempt)
            if last:
                raise ConductorUnavailable(problem)
            logger.debug("%s not delivered (%s); retrying in %.1fs", body["type"], problem, delay)
            await pause(delay, until)

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


async def pause(seconds: float, until: asyncio.Event | None = None) -> None:
    """Wait before a retry; cut short when `until` is set."""
    if until is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(until.wait(), seconds)


def _fenced(answer: httpx.Response) -> FencedAnswer | None:
    if answer.status_code != 409:
        return None
    data = answer.json()
    return FencedAnswer(int(data["attempt"]), str(data["state"]), str(data.get("detail", "")))


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
