"""Agents authenticated by their pods' ServiceAccount tokens (RIG_K8S_AGENT_AUTH) on the real
API, with the TokenReviews answered by the stand-in through the official client: a pod speaks
as the consumer of its own name, for the agent that name resolves to, and for nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI
from kubernetes import client
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.token_review import TokenReviewer
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .standin import Fault, KubeStandIn

NAMESPACE = "agents"
DISPATCHER = "dispatcher-token-0123456789"


@pytest.fixture
async def conductor(
    make_settings: Callable[..., Settings],
    api: client.ApiClient,
    redis: Redis,
    engine: AsyncEngine,
) -> AsyncIterator[httpx.AsyncClient]:
    settings = make_settings(
        agent_ids=("dev-e", "dev-e-dotnet"),
        k8s_enabled="false",
        k8s_namespace=NAMESPACE,
        k8s_agent_auth=True,
        api_tokens=DISPATCHER,
    )
    reviewer = TokenReviewer(
        api, audience=settings.k8s_token_audience, namespace=NAMESPACE, timeout=(1.0, 1.0)
    )
    app: FastAPI = create_app(settings, schedule_reaper=False, reviewer=reviewer)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            yield http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def heartbeat(agent: str, consumer: str | None = None) -> dict[str, str]:
    event = {"type": "HEARTBEAT", "agentId": agent}
    return {**event, "consumer": consumer} if consumer else event


async def test_a_pod_speaks_as_itself_for_its_agent_only(
    conductor: httpx.AsyncClient, kube: KubeStandIn
) -> None:
    pod = "dev-e-rig-agent-runtime-0"
    token = kube.tokens.issue(namespace=NAMESPACE, pod=pod)
    for allowed in (heartbeat("dev-e", pod), heartbeat("dev-e")):
        answer = await conductor.post("/api/events", json=allowed, headers=bearer(token))
        assert answer.status_code == 202, answer.text
    for refused in (
        heartbeat("dev-e", "dev-e-rig-agent-runtime-1"),  # another pod of its agent
        heartbeat("dev-e-dotnet"),  # another agent
    ):
        answer = await conductor.post("/api/events", json=refused, headers=bearer(token))
        assert answer.status_code == 403, refused
    # Nothing else: no reads, no dispatch.
    assert (await conductor.get("/api/agents", headers=bearer(token))).status_code == 403
    dispatch = {"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev-e"}
    assert (
        await conductor.post("/api/events", json=dispatch, headers=bearer(token))
    ).status_code == 403
    # One review served every request: it is reused.
    assert kube.count("token-review") == 1
    # The configured tokens still work, and are never sent to a review.
    listed = await conductor.get("/api/agents", headers=bearer(DISPATCHER))
    assert listed.status_code == 200 and kube.count("token-review") == 1


async def test_a_pod_whose_name_resolves_to_no_known_agent_speaks_for_nobody(
    conductor: httpx.AsyncClient, kube: KubeStandIn
) -> None:
    token = kube.tokens.issue(namespace=NAMESPACE, pod="stranger-0")
    answer = await conductor.post("/api/events", json=heartbeat("stranger"), headers=bearer(token))
    assert answer.status_code == 403 and "no known agent" in answer.json()["detail"]


@pytest.mark.parametrize(
    "issue",
    [
        {"namespace": "elsewhere", "pod": "dev-e-0"},  # another namespace
        {"namespace": NAMESPACE, "pod": "dev-e-0", "audiences": ("vault",)},  # another audience
        {"namespace": NAMESPACE, "pod": None},  # a ServiceAccount token bound to no pod
    ],
)
async def test_a_token_the_review_does_not_accept_is_401(
    conductor: httpx.AsyncClient, kube: KubeStandIn, issue: dict[str, object]
) -> None:
    token = kube.tokens.issue(**issue)  # type: ignore[arg-type]
    answer = await conductor.post("/api/events", json=heartbeat("dev-e"), headers=bearer(token))
    assert answer.status_code == 401
    unknown = await conductor.post(
        "/api/events", json=heartbeat("dev-e"), headers=bearer("not-a-token-anybody-issued")
    )
    assert unknown.status_code == 401


async def test_a_failing_kubernetes_api_is_503_with_retry_after_never_401(
    conductor: httpx.AsyncClient, kube: KubeStandIn
) -> None:
    token = kube.tokens.issue(namespace=NAMESPACE, pod="dev-e-0")
    kube.inject(Fault("token-review", status=500, times=None))
    answer = await conductor.post("/api/events", json=heartbeat("dev-e"), headers=bearer(token))
    assert answer.status_code == 503 and answer.headers["retry-after"]
    kube.clear_faults()
    answer = await conductor.post("/api/events", json=heartbeat("dev-e"), headers=bearer(token))
    assert answer.status_code == 202
