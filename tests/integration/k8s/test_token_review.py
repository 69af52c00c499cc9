"""The TokenReview adapter through the official client against the API stand-in: who a pod is,
what is refused, what a failing API answers, and how long a review is reused."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from rig_conductor.adapters import kubernetes, token_review
from rig_conductor.adapters.token_review import (
    NEGATIVE_TTL_S,
    PodIdentity,
    ReviewUnavailable,
    TokenReviewer,
    Unauthenticated,
    token_expiry,
)
from rig_conductor.settings import Settings

from ..helpers import wait_for
from .standin import Fault, KubeStandIn
from .standin_tokens import jwt
from .test_config import kubeconfig

NOW = 1_900_000_000.0


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reviewer(api: client.ApiClient, clock: Clock) -> TokenReviewer:
    return TokenReviewer(
        api, audience="rig-conductor", namespace="agents", clock=clock, timeout=(1.0, 1.0)
    )


async def test_a_pod_bound_token_names_its_pod_and_service_account(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    token = kube.tokens.issue(namespace="agents", service_account="builder", pod="dev-e-0")

    identity = await reviewer.review(token.encode())

    assert identity == PodIdentity(namespace="agents", pod="dev-e-0", service_account="builder")
    assert kube.tokens.reviews == 1


@pytest.mark.parametrize(
    ("issued", "why"),
    [
        ({"namespace": "agents", "audiences": ("vault",)}, "invalid for the target audiences"),
        ({"namespace": "agents", "audience_aware": False}, "not for the audience 'rig-conductor'"),
        ({"namespace": "elsewhere"}, "namespace 'elsewhere', not 'agents'"),
        ({"namespace": "agents", "pod": None}, "not bound to a pod"),
    ],
    ids=["another-audience", "audience-unaware", "another-namespace", "no-pod"],
)
async def test_tokens_that_prove_no_pod_of_ours_are_refused(
    kube: KubeStandIn, reviewer: TokenReviewer, issued: dict[str, object], why: str
) -> None:
    token = kube.tokens.issue(**issued)  # type: ignore[arg-type]

    with pytest.raises(Unauthenticated, match=why):
        await reviewer.review(token.encode())
    assert reviewer.cached() == 0


async def test_an_unknown_or_revoked_token_is_not_authenticated(
    kube: KubeStandIn, reviewer: TokenReviewer, clock: Clock
) -> None:
    unknown = jwt({"sub": "system:serviceaccount:agents:rig-agent"})  # issued by nobody
    with pytest.raises(Unauthenticated, match=r"not authenticated: .*invalid bearer token"):
        await reviewer.review(unknown.encode())
    with pytest.raises(Unauthenticated, match="not a JWT"):  # never sent to the API server
        await reviewer.review(b"not-a-token-the-api-server-issued")
    revoked = kube.tokens.issue(namespace="agents")
    kube.tokens.revoke(revoked)
    with pytest.raises(Unauthenticated, match="not authenticated"):
        await reviewer.review(revoked.encode())
    assert kube.tokens.reviews == 2

    # A refusal is remembered for a few seconds only, then asked again.
    with pytest.raises(Unauthenticated, match="not authenticated"):
        await reviewer.review(revoked.encode())
    assert kube.tokens.reviews == 2
    clock.now += NEGATIVE_TTL_S
    with pytest.raises(Unauthenticated):
        await reviewer.review(revoked.encode())
    assert kube.tokens.reviews == 3


async def test_a_token_no_api_server_would_take_costs_no_call(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    for token in (b"", "t\u00f6ken".encode(), b"two words", b"x" * 20_000):
        with pytest.raises(Unauthenticated):
            await reviewer.review(token)
    assert kube.count("token-review") == 0


@pytest.mark.parametrize("status", [500, 403, 401, 503])
async def test_a_failing_api_is_unavailable_and_not_remembered(
    kube: KubeStandIn, reviewer: TokenReviewer, status: int
) -> None:
    token = kube.tokens.issue(namespace="agents")
    kube.inject(Fault("token-review", status=status))

    with pytest.raises(ReviewUnavailable, match=f"TokenReview failed: {status}") as failed:
        await reviewer.review(token.encode())
    assert failed.value.status == status

    assert (await reviewer.review(token.encode())).pod == "dev-e-0"  # asked again, answered
    assert kube.count("token-review") == 2


async def test_a_review_that_times_out_is_unavailable(
    kube: KubeStandIn, api: client.ApiClient, clock: Clock
) -> None:
    reviewer = TokenReviewer(
        api, audience="rig-conductor", namespace="agents", clock=clock, timeout=(1.0, 0.2)
    )
    token = kube.tokens.issue(namespace="agents")
    kube.inject(Fault("token-review", delay=1.0))

    with pytest.raises(ReviewUnavailable, match=r"TokenReview failed: .*Timeout"):
        await reviewer.review(token.encode())
    assert reviewer.cached() == 0


async def test_an_api_server_nobody_listens_on_is_unavailable(clock: Clock) -> None:
    with KubeStandIn() as gone:
        url = gone.url
    api = kubernetes.api_client(configuration=client.Configuration(host=url))
    try:
        reviewer = TokenReviewer(api, audience="rig-conductor", namespace="agents", clock=clock)
        with pytest.raises(ReviewUnavailable):
            await reviewer.review(jwt({"exp": NOW + 600}).encode())
    finally:
        api.close()


async def test_a_review_is_reused_for_five_minutes_at_most(
    kube: KubeStandIn, reviewer: TokenReviewer, clock: Clock
) -> None:
    token = kube.tokens.issue(namespace="agents", exp=NOW + 3600).encode()

    await reviewer.review(token)
    clock.now += 299
    await reviewer.review(token)
    assert kube.tokens.reviews == 1  # the second review cost no API call

    clock.now += 1  # five minutes after the review
    await reviewer.review(token)
    assert kube.tokens.reviews == 2


async def test_a_review_is_never_reused_past_the_tokens_expiry(
    kube: KubeStandIn, reviewer: TokenReviewer, clock: Clock
) -> None:
    token = kube.tokens.issue(namespace="agents", exp=NOW + 60).encode()
    no_exp = kube.tokens.issue(namespace="agents").encode()
    assert token_expiry(token) == NOW + 60
    assert token_expiry(no_exp) is None

    await reviewer.review(token)
    await reviewer.review(no_exp)
    clock.now += 59
    await reviewer.review(token)
    await reviewer.review(no_exp)
    assert kube.tokens.reviews == 2

    clock.now += 1  # the token's exp: asked again (the real server would now refuse it)
    await reviewer.review(token)
    assert kube.tokens.reviews == 3
    await reviewer.review(no_exp)  # no exp: the five minutes still hold
    assert kube.tokens.reviews == 3


async def test_an_already_expired_token_is_not_remembered(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    token = kube.tokens.issue(namespace="agents", exp=NOW - 1).encode()
    await reviewer.review(token)  # the stand-in does not check exp; the cache still must
    await reviewer.review(token)
    assert kube.tokens.reviews == 2


async def test_the_cache_is_bounded_and_drops_the_oldest_review(
    kube: KubeStandIn, api: client.ApiClient, clock: Clock
) -> None:
    reviewer = TokenReviewer(
        api, audience="rig-conductor", namespace="agents", clock=clock, max_entries=2
    )
    first, second, third = (
        kube.tokens.issue(namespace="agents", pod=f"dev-e-{n}").encode() for n in range(3)
    )
    for token in (first, second, third):
        await reviewer.review(token)
    assert reviewer.cached() == 2

    await reviewer.review(third)
    await reviewer.review(second)
    assert kube.tokens.reviews == 3
    await reviewer.review(first)  # evicted: asked again
    assert kube.tokens.reviews == 4


async def test_concurrent_reviews_of_one_new_token_share_one_call(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    token = kube.tokens.issue(namespace="agents", pod="dev-e-7").encode()
    other = kube.tokens.issue(namespace="agents", pod="qa-e-0").encode()
    kube.inject(Fault("token-review", delay=0.3, times=None))  # all arrive while one is asked

    answers = await asyncio.gather(*(reviewer.review(t) for t in [token] * 20 + [other] * 5))

    assert {a.pod for a in answers[:20]} == {"dev-e-7"}
    assert {a.pod for a in answers[20:]} == {"qa-e-0"}
    assert kube.count("token-review") == 2


async def test_a_shared_failure_reaches_every_waiter_and_is_not_remembered(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    token = kube.tokens.issue(namespace="agents").encode()
    kube.inject(Fault("token-review", status=500, delay=0.3))

    answers = await asyncio.gather(
        *(reviewer.review(token) for _ in range(5)), return_exceptions=True
    )

    assert all(isinstance(a, ReviewUnavailable) for a in answers)
    assert kube.count("token-review") == 1
    assert (await reviewer.review(token)).pod == "dev-e-0"


async def test_one_waiter_giving_up_does_not_cancel_the_others(
    kube: KubeStandIn, reviewer: TokenReviewer
) -> None:
    token = kube.tokens.issue(namespace="agents").encode()
    kube.inject(Fault("token-review", delay=0.3))
    impatient = asyncio.create_task(reviewer.review(token))
    patient = asyncio.create_task(reviewer.review(token))
    await wait_for(lambda: kube.count("token-review") == 1, within=10)  # both wait on that call
    impatient.cancel()

    assert (await patient).pod == "dev-e-0"
    assert kube.count("token-review") == 1


def test_the_factory_follows_the_settings(
    kube: KubeStandIn, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    missing = {"KUBECONFIG": str(tmp_path / "missing")}
    off = make_settings(k8s_agent_auth=False)
    assert token_review.build_reviewer(off, environ=missing) is None
    assert token_review.startup_problem(off, environ=missing) is None

    on = make_settings(k8s_agent_auth=True, k8s_token_audience="rigs", k8s_namespace="agents")
    problem = token_review.startup_problem(on, environ=missing)
    assert problem is not None
    assert problem.startswith("RIG_K8S_AGENT_AUTH=true, but no in-cluster configuration")
    with pytest.raises(kubernetes.KubernetesConfigError):
        token_review.build_reviewer(on, environ=missing)

    found = {"KUBECONFIG": str(kubeconfig(tmp_path / "config", kube.url))}
    assert token_review.startup_problem(on, environ=found) is None
    reviewer = token_review.build_reviewer(on, environ=found)
    assert reviewer is not None
    reviewer.api_client.close()
    assert (reviewer.audience, reviewer.namespace) == ("rigs", "agents")
