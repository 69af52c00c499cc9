"""Wrong tokens cost the Kubernetes API nothing once a client is throttled: with
RIG_K8S_AGENT_AUTH, a client in its 429 window is answered before any TokenReview, and a token
that is not a JWT is never reviewed. Reviews counted by the stand-in, through the real client."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.token_review import TokenReviewer
from rig_conductor.api.access import API_FREE_FAILURES
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .standin import KubeStandIn
from .standin_tokens import jwt

NAMESPACE = "agents"
GUESSER = "203.0.113.7"


@pytest.fixture
async def app(
    make_settings: Callable[..., Settings],
    api: client.ApiClient,
    redis: Redis,
    engine: AsyncEngine,
) -> AsyncIterator[FastAPI]:
    settings = make_settings(
        agent_ids=("dev-e",),
        k8s_enabled="false",
        k8s_namespace=NAMESPACE,
        k8s_agent_auth=True,
        api_tokens="dispatcher-token-0123456789",
    )
    reviewer = TokenReviewer(
        api, audience=settings.k8s_token_audience, namespace=NAMESPACE, timeout=(1.0, 1.0)
    )
    built = create_app(settings, schedule_reaper=False, reviewer=reviewer)
    built.state.api_throttle.clock = lambda: 1000.0  # no time passes: the window stays open
    async with built.router.lifespan_context(built):
        yield built


@pytest.fixture
async def guesser(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, client=(GUESSER, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        yield http


async def beat(http: httpx.AsyncClient, token: str) -> int:
    """A heartbeat with `token`; its answer's status."""
    answer = await http.post(
        "/api/events",
        json={"type": "HEARTBEAT", "agentId": "dev-e"},
        headers={"Authorization": f"Bearer {token}"},
    )
    return answer.status_code


def forged() -> str:
    """JWT-shaped, so worth a review, but issued by nobody."""
    return jwt({"sub": "system:serviceaccount:agents:rig-agent", "jti": str(uuid.uuid4())})


async def test_a_client_in_its_429_window_makes_no_more_reviews(
    guesser: httpx.AsyncClient, kube: KubeStandIn
) -> None:
    statuses = [await beat(guesser, forged()) for _ in range(30)]
    assert statuses == [401] * API_FREE_FAILURES + [429] * (30 - API_FREE_FAILURES)
    assert kube.count("token-review") == API_FREE_FAILURES


async def test_a_pod_reviewed_before_is_not_refused_while_its_address_waits(
    guesser: httpx.AsyncClient, kube: KubeStandIn
) -> None:
    token = kube.tokens.issue(namespace=NAMESPACE, pod="dev-e-0")
    assert await beat(guesser, token) == 202
    for _ in range(API_FREE_FAILURES):
        assert await beat(guesser, forged()) == 401
    assert await beat(guesser, forged()) == 429
    reviews = kube.count("token-review")
    assert await beat(guesser, token) == 202  # reviewed lately: honoured without asking
    assert kube.count("token-review") == reviews


@pytest.mark.parametrize(
    "token",
    [
        "not-a-jwt-at-all-0123456789",
        "aaaa.bbbb.cccc",  # three parts, but the first is no JSON
        "eyJhbGciOiJSUzI1NiJ9.e30",  # two parts
        "eyJhbGciOiJSUzI1NiJ9.e30.c2ln.ZXh0cmE",  # four parts
        "eyJhbGciOiJSUzI1NiJ9.e30.c2ln+/==",  # not base64url
        "WyJub3QiLCJhbiIsIm9iamVjdCJd.e30.c2ln",  # a JSON header, but not an object
    ],
)
async def test_a_token_that_is_not_a_jwt_is_never_reviewed(
    app: FastAPI, kube: KubeStandIn, token: str
) -> None:
    transport = httpx.ASGITransport(app=app, client=(f"198.51.100.{secrets.randbelow(200)}", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        assert await beat(http, token) == 401
    assert kube.count("token-review") == 0


async def test_thirty_random_strings_make_no_review(app: FastAPI, kube: KubeStandIn) -> None:
    for n in range(30):
        transport = httpx.ASGITransport(app=app, client=(f"192.0.2.{n}", 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            assert await beat(http, secrets.token_urlsafe(32)) == 401
    assert kube.count("token-review") == 0
