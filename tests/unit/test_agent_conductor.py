"""The conductor client through httpx's MockTransport: answers, fencing, retries, Retry-After."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from rig_conductor.agent import conductor
from rig_conductor.agent.conductor import (
    Accepted,
    ConductorClient,
    ConductorRejected,
    ConductorUnavailable,
    FencedAnswer,
)

Reply = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the delays asked for instead of sleeping them."""
    slept: list[float] = []

    async def pause(seconds: float, until: asyncio.Event | None = None) -> None:
        slept.append(seconds)

    monkeypatch.setattr(conductor, "pause", pause)
    return slept


def client(*replies: Reply, seen: list[httpx.Request] | None = None) -> ConductorClient:
    queue = list(replies)

    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return reply(request)

    return ConductorClient(
        base_url="http://conductor",
        agent_id="dev-e",
        consumer="dev-e-0",
        token="t0k",
        transport=httpx.MockTransport(handle),
    )


def answer(status: int, body: object, **headers: str) -> Reply:
    return lambda request: httpx.Response(status, json=body, headers=headers)


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


async def test_work_started_sends_the_contract_body_with_the_token() -> None:
    seen: list[httpx.Request] = []
    api = client(answer(202, {"attempt": 3}), seen=seen)
    started = await api.work_started(stream="rig:dispatch", entry_id="1-0", issue_id="rc-1")
    await api.aclose()
    assert started == Accepted(3, "running")
    (request,) = seen
    assert request.url.path == "/api/events"
    assert request.headers["authorization"] == "Bearer t0k"
    assert json.loads(request.content) == {
        "type": "WORK_STARTED",
        "agentId": "dev-e",
        "consumer": "dev-e-0",
        "stream": "rig:dispatch",
        "entryId": "1-0",
        "issueId": "rc-1",
    }


async def test_a_409_is_a_fence_not_an_error() -> None:
    body = {"detail": "fenced: the entry is already done", "attempt": 2, "state": "done"}
    api = client(answer(409, body))
    fenced = await api.work_completed(stream="s", entry_id="1-0", issue_id=None, attempt=1)
    await api.aclose()
    assert fenced == FencedAnswer(2, "done", "fenced: the entry is already done") and fenced.done


async def test_503_is_retried_after_the_time_it_asks_for(no_waiting: list[float]) -> None:
    api = client(
        answer(503, {"detail": "PostgreSQL is unavailable"}, **{"Retry-After": "5"}),
        answer(202, {"accepted": True, "attempt": 1, "state": "done"}),
    )
    done = await api.work_completed(stream="s", entry_id="1-0", issue_id="rc-1", attempt=1)
    await api.aclose()
    assert done == Accepted(1, "done")
    assert no_waiting == [5.0]


async def test_connection_errors_back_off_and_give_up_after_the_tries(
    no_waiting: list[float],
) -> None:
    api = client(refuse)
    with pytest.raises(ConductorUnavailable, match="ConnectError"):
        await api.work_started(stream="s", entry_id="1-0", issue_id=None, tries=3)
    await api.aclose()
    assert len(no_waiting) == 2
    assert 0.25 <= no_waiting[0] <= 0.5 and 0.5 <= no_waiting[1] <= 1.0


async def test_completion_retries_until_shutdown_then_tries_once_more() -> None:
    calls: list[httpx.Request] = []
    stop = asyncio.Event()

    def down(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 4:
            stop.set()
        raise httpx.ConnectError("refused", request=request)

    api = client(down)
    with pytest.raises(ConductorUnavailable):
        await api.work_completed(stream="s", entry_id="1-0", issue_id=None, attempt=1, until=stop)
    await api.aclose()
    assert len(calls) == 5


async def test_a_rejected_request_is_not_retried() -> None:
    seen: list[httpx.Request] = []
    api = client(answer(401, {"detail": "missing or invalid bearer token"}), seen=seen)
    with pytest.raises(ConductorRejected, match="401 missing or invalid bearer token"):
        await api.heartbeat()
    await api.aclose()
    assert len(seen) == 1
    assert json.loads(seen[0].content) == {
        "type": "HEARTBEAT",
        "consumer": "dev-e-0",
        "agentId": "dev-e",
    }


def test_retry_after_reads_seconds_and_dates() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert conductor.retry_after("7") == 7.0
    assert conductor.retry_after("3600") == conductor.RETRY_AFTER_MAX_S
    assert conductor.retry_after("Thu, 01 Jan 2026 12:00:09 GMT", now=now) == 9.0
    assert conductor.retry_after("Thu, 01 Jan 2026 11:00:00 GMT", now=now) == 0.0
    assert conductor.retry_after("whenever") is None
    assert conductor.retry_after(None) is None


class Flaky:
    """A call that fails `failures` times with `error`, then returns "ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.left, self.error, self.calls = failures, error, 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return "ok"


async def test_retry_backs_off_between_failures_and_logs_each(no_waiting: list[float]) -> None:
    logged: list[tuple[str, float]] = []
    call = Flaky(3, ConductorUnavailable("down"))
    got = await conductor.retry(
        call, retry_on=ConductorUnavailable, log=lambda exc, s: logged.append((str(exc), s))
    )
    assert (got, call.calls) == ("ok", 4)
    assert [problem for problem, _ in logged] == ["down"] * 3
    assert no_waiting == [seconds for _, seconds in logged]
    for n, seconds in enumerate(no_waiting, start=1):
        ceiling = min(conductor.BACKOFF_MAX_S, conductor.BACKOFF_START_S * 2 ** (n - 1))
        assert ceiling / 2 <= seconds <= ceiling


@pytest.mark.parametrize(
    ("asked", "expected"),
    [(5.0, [5.0, 5.0]), (None, "backoff"), (0.0, "backoff")],
)
async def test_retry_waits_what_delay_asks_else_the_backoff(
    no_waiting: list[float], asked: float | None, expected: object
) -> None:
    call = Flaky(2, ConductorUnavailable("down"))
    await conductor.retry(call, retry_on=ConductorUnavailable, delay=lambda exc, n: asked)
    if expected == "backoff":
        assert 0.25 <= no_waiting[0] <= 0.5 and 0.5 <= no_waiting[1] <= 1.0
    else:
        assert no_waiting == expected


async def test_retry_raises_the_last_failure_and_never_retries_others(
    no_waiting: list[float],
) -> None:
    call = Flaky(5, ConductorUnavailable("down"))
    with pytest.raises(ConductorUnavailable, match="down"):
        await conductor.retry(call, retry_on=ConductorUnavailable, tries=3)
    assert (call.calls, len(no_waiting)) == (3, 2)
    refused = Flaky(5, ConductorRejected("401"))
    with pytest.raises(ConductorRejected):
        await conductor.retry(refused, retry_on=ConductorUnavailable)
    assert refused.calls == 1


async def test_retry_after_a_stop_makes_one_last_try(no_waiting: list[float]) -> None:
    stop = asyncio.Event()
    stop.set()
    call = Flaky(5, ConductorUnavailable("down"))
    with pytest.raises(ConductorUnavailable):
        await conductor.retry(call, retry_on=ConductorUnavailable, stop=stop)
    assert (call.calls, no_waiting) == (1, [])
