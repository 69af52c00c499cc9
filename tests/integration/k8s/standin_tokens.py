"""The TokenReview slice of the kube-apiserver stand-in: `authentication.k8s.io/v1` answers.

`POST /apis/authentication.k8s.io/v1/tokenreviews` takes a TokenReview whose spec names a token
and the audiences the caller wants; the answer is the same object with a `status`, as the real
API server writes it (201 Created, the spec echoed back):
- a known, valid token: `authenticated: true`, `user` (username
  `system:serviceaccount:<ns>:<sa>`, uid, groups, `extra` with the pod's name and uid when the
  token is bound to a pod), and `audiences`: the ones the caller asked for that the token carries;
- a token for none of the audiences asked for, an unknown or a revoked token:
  `authenticated: false` and an `error`, as the real server says it.

Test-only code, called by the stand-in's HTTP handler under its lock.
"""

from __future__ import annotations

import base64
import json
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

API_VERSION = "authentication.k8s.io/v1"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
DEFAULT_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


@dataclass
class IssuedToken:
    """What the API server knows about one token it issued."""

    namespace: str
    service_account: str
    pod: str | None  # None: a plain ServiceAccount token, not bound to a pod
    audiences: tuple[str, ...]
    authenticated: bool = True  # False: revoked (its pod deleted, its Secret gone)
    # False: an authenticator that ignores audiences (a webhook, say): no status.audiences.
    audience_aware: bool = True
    pod_uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    account_uid: str = field(default_factory=lambda: str(uuid.uuid4()))


def jwt(claims: dict[str, Any]) -> str:
    """A JWT-shaped token carrying `claims` (the signature is not checked by anyone here)."""

    def part(value: dict[str, Any]) -> str:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'kid': 'standin'})}.{part(claims)}.c2lnbmF0dXJl"


class TokenTable:
    """Tokens the stand-in's API server issued, and how many reviews it answered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, IssuedToken] = {}
        self.reviews = 0

    def issue(
        self,
        *,
        namespace: str = "default",
        service_account: str = "rig-agent",
        pod: str | None = "dev-e-0",
        audiences: tuple[str, ...] = ("rig-conductor",),
        exp: float | None = None,
        token: str | None = None,
        audience_aware: bool = True,
    ) -> str:
        """A new token (JWT-shaped, with `exp` when given) the reviews will know."""
        claims: dict[str, Any] = {
            "aud": list(audiences),
            "sub": f"system:serviceaccount:{namespace}:{service_account}",
            "jti": str(uuid.uuid4()),
        }
        if exp is not None:
            claims["exp"] = int(exp)
        token = token or jwt(claims)
        with self._lock:
            self._tokens[token] = IssuedToken(
                namespace, service_account, pod, audiences, audience_aware=audience_aware
            )
        return token

    def revoke(self, token: str) -> None:
        with self._lock:
            self._tokens[token].authenticated = False

    def review(self, body: dict[str, Any]) -> dict[str, Any]:
        """The TokenReview the real API server answers for `body`."""
        spec = body.get("spec") or {}
        wanted = list(spec.get("audiences") or [DEFAULT_AUDIENCE])
        with self._lock:
            self.reviews += 1
            issued = self._tokens.get(str(spec.get("token") or ""))
        answer: dict[str, Any] = {
            "kind": "TokenReview",
            "apiVersion": API_VERSION,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
        }
        if issued is None or not issued.authenticated:
            error = "[invalid bearer token, token has been invalidated]"
            answer["status"] = {"user": {}, "error": error}
            return answer
        common = [a for a in wanted if a in issued.audiences]
        if not common:
            error = (
                f"[invalid bearer token, token audiences {json.dumps(issued.audiences)} "
                f"is invalid for the target audiences {json.dumps(wanted)}]"
            )
            answer["status"] = {"user": {}, "error": error}
            return answer
        answer["status"] = {"authenticated": True, "user": _user(issued)}
        if issued.audience_aware:
            answer["status"]["audiences"] = common
        return answer


def _user(issued: IssuedToken) -> dict[str, Any]:
    user: dict[str, Any] = {
        "username": f"system:serviceaccount:{issued.namespace}:{issued.service_account}",
        "uid": issued.account_uid,
        "groups": [
            "system:serviceaccounts",
            f"system:serviceaccounts:{issued.namespace}",
            "system:authenticated",
        ],
    }
    if issued.pod is not None:
        user["extra"] = {
            POD_NAME: [issued.pod],
            POD_UID: [issued.pod_uid],
            "authentication.kubernetes.io/credential-id": [f"JTI={uuid.uuid4()}"],
        }
    return user
