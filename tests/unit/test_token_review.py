"""What a TokenReview's status must say for a token to be a pod of ours, and the JWT `exp` that
bounds how long a review is reused: pure functions, no API server."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from rig_conductor.adapters.token_review import (
    PodIdentity,
    Unauthenticated,
    identity_of,
    looks_like_jwt,
    token_expiry,
)

POD = {"authentication.kubernetes.io/pod-name": ["dev-e-0"]}


def status(
    username: str = "system:serviceaccount:agents:builder",
    *,
    authenticated: bool | None = True,
    audiences: list[str] | None = None,
    extra: dict[str, list[str]] | None = POD,
    error: str | None = None,
) -> client.V1TokenReviewStatus:
    return client.V1TokenReviewStatus(
        authenticated=authenticated,
        audiences=["rig-conductor"] if audiences is None else audiences,
        user=client.V1UserInfo(username=username, extra=extra),
        error=error,
    )


def test_a_pod_of_ours_for_our_audience() -> None:
    assert identity_of(status(), audience="rig-conductor", namespace="agents") == PodIdentity(
        namespace="agents", pod="dev-e-0", service_account="builder"
    )


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "not authenticated: no reason given"),
        (status(authenticated=None), "not authenticated"),
        (status(authenticated=False, error="token expired"), "not authenticated: token expired"),
        (status(audiences=[]), "not for the audience"),
        (status(audiences=["vault"]), "not for the audience"),
        (status("alice"), "not a ServiceAccount token"),
        (status("system:serviceaccount:agents"), "not a ServiceAccount token"),
        (status("system:serviceaccount:other:builder"), "namespace 'other', not 'agents'"),
        (status(extra=None), "not bound to a pod"),
        (status(extra={"authentication.kubernetes.io/pod-name": []}), "not bound to a pod"),
        (status(extra={"authentication.kubernetes.io/pod-name": [""]}), "not bound to a pod"),
    ],
)
def test_anything_else_is_refused_saying_why(
    answer: client.V1TokenReviewStatus | None, why: str
) -> None:
    with pytest.raises(Unauthenticated, match=why):
        identity_of(answer, audience="rig-conductor", namespace="agents")


def jwt_with(payload: bytes) -> bytes:
    encoded = base64.urlsafe_b64encode(payload).rstrip(b"=")
    return b"eyJhbGciOiJSUzI1NiJ9." + encoded + b".c2ln"


@pytest.mark.parametrize(
    ("token", "exp"),
    [
        (jwt_with(json.dumps({"exp": 1_900_000_000}).encode()), 1_900_000_000.0),
        (jwt_with(json.dumps({"exp": 1.5}).encode()), 1.5),
        (jwt_with(json.dumps({"exp": "soon"}).encode()), None),
        (jwt_with(json.dumps({"exp": True}).encode()), None),
        (jwt_with(json.dumps({"sub": "x"}).encode()), None),
        (jwt_with(json.dumps([1, 2]).encode()), None),
        (jwt_with(b"not json"), None),
        (b"a.%%%.c", None),
        (b"opaque-token", None),
        (b"a.b.c.d", None),
    ],
)
def test_the_expiry_is_read_from_the_payload_when_there_is_one(
    token: bytes, exp: float | None
) -> None:
    assert token_expiry(token) == exp


@pytest.mark.parametrize(
    ("token", "jwt"),
    [
        (b"eyJhbGciOiJSUzI1NiJ9.e30.c2ln", True),  # {"alg":"RS256"}.{}.sig
        (b"eyJhbGciOiJSUzI1NiIsImtpZCI6IngifQ.eyJzdWIiOiJ4In0.c2lnbmF0dXJl", True),
        (b"not-a-jwt-at-all-0123456789", False),
        (b"aaaa.bbbb.cccc", False),  # three parts, the first no JSON
        (b"eyJhbGciOiJSUzI1NiJ9.e30", False),  # two parts
        (b"eyJhbGciOiJSUzI1NiJ9.e30.c2ln.ZXh0cmE", False),  # four
        (b"eyJhbGciOiJSUzI1NiJ9..c2ln", False),  # an empty part
        (b"eyJhbGciOiJSUzI1NiJ9.e30.c2ln+/==", False),  # not base64url
        (b"WyJub3QiLCJhbiIsIm9iamVjdCJd.e30.c2ln", False),  # a JSON array, not an object
        (b"", False),
    ],
)
def test_only_a_jwt_shaped_token_is_worth_a_review(token: bytes, jwt: bool) -> None:
    assert looks_like_jwt(token) is jwt
