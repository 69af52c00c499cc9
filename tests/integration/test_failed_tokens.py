"""Wrong tokens slowed down per client (429 with Retry-After), a valid token never refused, and
the client address (X-Forwarded-For) and scheme (X-Forwarded-Proto) taken from forwarding
headers only behind a trusted proxy (RIG_FORWARDED_ALLOW_IPS)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis

from .console_kit import AGENT, OPERATOR, builder, post_sign_in
from .helpers import serve

GUESSER, OTHER = "203.0.113.7", "198.51.100.9"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def heartbeat() -> dict[str, str]:
    return {"type": "HEARTBEAT", "agentId": "dev-e", "consumer": "dev-e-0"}


@pytest.fixture
def build(make_settings: Callable[..., object], redis: Redis) -> Callable[..., FastAPI]:
    return builder(make_settings)  # type: ignore[arg-type]


@asynccontextmanager
async def clients(app: FastAPI, *hosts: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    """One client per address, all talking to `app` (started once)."""
    async with app.router.lifespan_context(app):
        opened = [
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=(host, 40000)), base_url="http://c"
            )
            for host in hosts
        ]
        try:
            yield opened
        finally:
            for client in opened:
                await client.aclose()


async def test_a_client_that_keeps_failing_waits_and_valid_tokens_pass(
    build: Callable[..., FastAPI],
) -> None:
    app = build()
    now = [1000.0]
    app.state.api_throttle.clock = lambda: now[0]
    async with clients(app, GUESSER, OTHER) as (guesser, other):
        for n in range(5):  # the free failures
            wrong = await guesser.get("/api/agents", headers=bearer(f"guess-{n:012d}"))
            assert wrong.status_code == 401
        slowed = await guesser.post("/api/events", json=heartbeat(), headers=bearer("guess-5"))
        assert slowed.status_code == 429 and slowed.headers["retry-after"] == "1"
        assert "too many invalid tokens" in slowed.json()["detail"]
        # A valid token from the same address is never refused, and a missing one guesses nothing.
        ok = await guesser.post("/api/events", json=heartbeat(), headers=bearer(AGENT))
        assert ok.status_code == 202
        assert (await guesser.get("/api/agents", headers=bearer(OPERATOR))).status_code == 200
        assert (await guesser.get("/api/agents")).status_code == 401
        # Another client is not slowed down by the guesser.
        assert (await other.get("/api/agents", headers=bearer("guess-x"))).status_code == 401
        now[0] += 1.5  # waited: the next wrong token is looked at and counted again
        assert (await guesser.get("/api/agents", headers=bearer("guess-6"))).status_code == 401
        again = await guesser.get("/api/agents", headers=bearer("guess-7"))
        assert again.status_code == 429 and again.headers["retry-after"] == "2"  # doubling
        now[0] += 900  # forgotten after a quiet spell
        assert (await guesser.get("/api/agents", headers=bearer("guess-8"))).status_code == 401
    # Only failures leave a trace: the valid requests above kept nothing.
    assert set(app.state.api_throttle._seen) == {GUESSER, OTHER}


def test_the_throttle_keeps_a_bounded_number_of_clients(build: Callable[..., FastAPI]) -> None:
    throttle = build().state.api_throttle
    assert throttle.max_clients == 10_000  # each entry is an address, a count and a time
    for n in range(throttle.max_clients + 50):
        throttle.failed(f"10.{n // 65536}.{n // 256 % 256}.{n % 256}")
    assert len(throttle._seen) == throttle.max_clients


def _clients_logged(stderr: str) -> list[str | None]:
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [r.get("client") for r in records if r.get("status") == 401]


def _sign_ins_refused(stderr: str) -> list[str]:
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [r["client"] for r in records if "Sign-in refused" in r.get("message", "")]


@pytest.mark.parametrize(
    ("trusted", "seen"),
    [
        ("127.0.0.1", GUESSER),
        ("127.0.0.0/8", GUESSER),
        ("", "127.0.0.1"),  # nobody trusted: not even the loopback uvicorn trusts by default
        ("192.0.2.0/24", "127.0.0.1"),  # proxies elsewhere: this peer is not one of them
    ],
)
async def test_forwarding_headers_are_believed_only_from_a_trusted_proxy(
    redis: Redis, redis_url: str, database_url: str, trusted: str, seen: str
) -> None:
    forwarded = {"X-Forwarded-For": f"{GUESSER}, 127.0.0.1"}  # the proxy appends its peer
    async with (
        serve(
            redis_url,
            database_url,
            RIG_OPERATOR_TOKENS=OPERATOR,
            RIG_FORWARDED_ALLOW_IPS=trusted,
            RIG_ALLOW_ANONYMOUS="false",
            RIG_LOG_FORMAT="json",
            RIG_K8S_ENABLED="false",
        ) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as client,
    ):
        wrong = await client.get("/api/agents", headers={**bearer("guess-0"), **forwarded})
        assert wrong.status_code == 401
        signed = await post_sign_in(client, {"token": "guess-1"}, headers=forwarded)
        assert signed.status_code == 401
        # Plain http claiming https: a Secure `__Host-` cookie only on a trusted proxy's word.
        form = await client.get("/ui/login", headers={"X-Forwarded-Proto": "https"})
        cookie = form.headers["set-cookie"]
    assert _clients_logged(conductor.stderr)[:1] == [seen]
    assert _sign_ins_refused(conductor.stderr) == [seen]
    believed = seen == GUESSER
    assert cookie.startswith("__Host-rig_signin=") is believed
    assert ("; secure" in cookie.lower()) is believed
