"""Pod identity from a projected ServiceAccount token, asked of the Kubernetes TokenReview API.

A token proves who a pod is only through the API server: this module never checks a signature
itself, and never stores a token (the cache is keyed by its SHA-256). What a pod may then say
("Who may speak for whom" in the contract) is decided by the caller, not here.

- `TokenReviewer.review(token)` answers a `PodIdentity`, or raises `Unauthenticated` (the review
  said no, or said yes to something that is not a pod of our namespace for our audience: 401)
  or `ReviewUnavailable` (the conductor's own call failed, timed out or was refused: 503).
- Successful reviews are reused for at most `max_age_s` (5 minutes), never past the token's
  own `exp`, so a fleet's heartbeats do not each cost an API call. Refusals are reused for
  `NEGATIVE_TTL_S` (5 s) in a separate, smaller cache, so a spray of bad tokens can neither
  hammer the API server nor push the good reviews out. A failed call is never remembered.
- Concurrent reviews of one token share one API call.
- A token that is not shaped like a JWT (three base64url segments, the first a JSON object) is
  refused without a call: no ServiceAccount token looks otherwise, and a spray of random
  strings must cost the API server nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rig_conductor.adapters import kubernetes
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
# (connect, read) seconds for one review: a heartbeat waits on it, so well below its timeout.
DEFAULT_TIMEOUT: kubernetes.Timeout = (3.0, 5.0)
NEGATIVE_TTL_S = 5.0
NEGATIVE_ENTRIES = 1_000
# A pod's token is a JWT of about a kilobyte; anything far larger is not worth an API call.
MAX_TOKEN_BYTES = 16_384
JWT_PARTS = 3  # header.payload.signature
_BASE64URL = re.compile(rb"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who a reviewed token belongs to: a pod of `namespace`, running as `service_account`."""

    namespace: str
    pod: str
    service_account: str


class Unauthenticated(Exception):
    """The token does not prove a pod of our namespace for our audience; the message says why."""


class ReviewUnavailable(Exception):
    """The TokenReview call itself failed (API error, 403, timeout): the answer is unknown.

    `status` is the API server's HTTP status when there was one.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class _Remembered:
    until: float  # clock() value after which the entry is stale
    identity: PodIdentity | None  # None: refused, with `reason`
    reason: str = ""


class TokenReviewer:
    """Reviews bearer tokens with the API server, caching answers as the module says.

    Use from one event loop. The API call runs in a worker thread (the client is synchronous).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        audience: str,
        namespace: str,
        max_age_s: float = 300.0,
        clock: Callable[[], float] = time.time,
        max_entries: int = 10_000,
        timeout: kubernetes.Timeout = DEFAULT_TIMEOUT,
    ) -> None:
        self.api_client = api_client
        self._api = client.AuthenticationV1Api(api_client)
        self.audience = audience
        self.namespace = namespace
        self._max_age_s = max_age_s
        self._clock = clock
        self._max_entries = max_entries
        self._timeout = timeout
        self._accepted: OrderedDict[bytes, _Remembered] = OrderedDict()
        self._refused: OrderedDict[bytes, _Remembered] = OrderedDict()
        self._in_flight: dict[bytes, asyncio.Task[PodIdentity]] = {}

    async def review(self, token: bytes) -> PodIdentity:
        """The pod `token` belongs to. Raises Unauthenticated or ReviewUnavailable."""
        if not looks_like_jwt(token):
            raise Unauthenticated("the token is not a JWT, so not a ServiceAccount token")
        key = hashlib.sha256(token).digest()
        remembered = self._recall(key)
        if remembered is not None:
            if remembered.identity is None:
                raise Unauthenticated(remembered.reason)
            return remembered.identity
        task = self._in_flight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._review_and_remember(key, token))
            self._in_flight[key] = task
            task.add_done_callback(lambda done: self._landed(key, done))
        # shield: one caller giving up (a client that hung up) does not cancel the others' call.
        return await asyncio.shield(task)

    def accepted(self, token: bytes) -> PodIdentity | None:
        """The pod of a token a review accepted lately (still cached), without any API call;
        None otherwise. Lets a caller honour a known-good token before anything else."""
        remembered = self._recall(hashlib.sha256(token).digest())
        return remembered.identity if remembered is not None else None

    def cached(self) -> int:
        """How many successful reviews are held (for tests and metrics)."""
        return len(self._accepted)

    def _recall(self, key: bytes) -> _Remembered | None:
        now = self._clock()
        for table in (self._accepted, self._refused):
            entry = table.get(key)
            if entry is None:
                continue
            if now < entry.until:
                return entry
            del table[key]
        return None

    def _landed(self, key: bytes, task: asyncio.Task[PodIdentity]) -> None:
        self._in_flight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so an answer nobody awaited any more is not logged

    async def _review_and_remember(self, key: bytes, token: bytes) -> PodIdentity:
        try:
            text = _token_text(token)
            status = await asyncio.to_thread(self._call, text)
            identity = identity_of(status, audience=self.audience, namespace=self.namespace)
        except Unauthenticated as refused:
            self._remember(
                self._refused,
                key,
                _Remembered(self._clock() + NEGATIVE_TTL_S, None, str(refused)),
                NEGATIVE_ENTRIES,
            )
            raise
        until = self._clock() + self._max_age_s
        expiry = token_expiry(token)
        if expiry is not None:
            until = min(until, expiry)
        if until > self._clock():
            self._remember(self._accepted, key, _Remembered(until, identity), self._max_entries)
        logger.debug(
            "TokenReview: pod %s/%s (ServiceAccount %s), reused until %.0f",
            identity.namespace,
            identity.pod,
            identity.service_account,
            until,
        )
        return identity

    @staticmethod
    def _remember(
        table: OrderedDict[bytes, _Remembered], key: bytes, entry: _Remembered, limit: int
    ) -> None:
        table[key] = entry
        table.move_to_end(key)
        while len(table) > limit:
            table.popitem(last=False)  # the oldest review goes first

    def _call(self, token: str) -> client.V1TokenReviewStatus | None:
        """One TokenReview, in a worker thread. Every failure is ReviewUnavailable."""
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[self.audience])
        )
        try:
            answer = self._api.create_token_review(body, _request_timeout=self._timeout)
        except ApiException as exc:
            status = exc.status if isinstance(exc.status, int) else None
            raise ReviewUnavailable(
                f"TokenReview failed: {kubernetes.status_message(exc)}", status=status
            ) from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError, TypeError) as exc:
            raise ReviewUnavailable(f"TokenReview failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(answer, client.V1TokenReview):
            raise ReviewUnavailable("TokenReview answered something other than a TokenReview")
        return answer.status


def identity_of(
    status: client.V1TokenReviewStatus | None, *, audience: str, namespace: str
) -> PodIdentity:
    """The pod a review's status names; Unauthenticated when it names no pod of ours."""
    if status is None or not status.authenticated:
        error = (status.error if status is not None else None) or "no reason given"
        raise Unauthenticated(f"the token review said not authenticated: {error}")
    if audience not in (status.audiences or ()):
        raise Unauthenticated(f"the token is not for the audience {audience!r}")
    user = status.user or client.V1UserInfo()
    username = str(user.username or "")
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        raise Unauthenticated("the token is not a ServiceAccount token")
    account_namespace, _, account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
    if not account:
        raise Unauthenticated("the token is not a ServiceAccount token")
    if account_namespace != namespace:
        raise Unauthenticated(
            f"the token's ServiceAccount is of namespace {account_namespace!r}, not {namespace!r}"
        )
    pods = (user.extra or {}).get(POD_NAME_KEY) or []
    if not pods or not pods[0]:
        raise Unauthenticated("the token is not bound to a pod (no projected pod token)")
    return PodIdentity(namespace=account_namespace, pod=str(pods[0]), service_account=account)


def token_expiry(token: bytes) -> float | None:
    """The `exp` claim of a JWT (seconds since the epoch), or None when it has none readable.

    No signature check: the API server has validated the token; this only bounds the cache.
    """
    parts = token.split(b".")
    if len(parts) != JWT_PARTS:
        return None
    payload = parts[1] + b"=" * (-len(parts[1]) % 4)
    try:
        claims: Any = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp)


def looks_like_jwt(token: bytes) -> bool:
    """Whether `token` has a JWT's shape: `header.payload.signature`, each part base64url
    (unpadded), the header a JSON object. Nothing is verified: it only spares the API server
    the tokens that cannot be ServiceAccount tokens."""
    if not token or len(token) > MAX_TOKEN_BYTES:
        return False
    parts = token.split(b".")
    if len(parts) != JWT_PARTS or not all(parts) or not all(map(_BASE64URL.fullmatch, parts)):
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + b"=" * (-len(parts[0]) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(header, dict)


def build_reviewer(
    settings: Settings,
    *,
    environ: Mapping[str, str] | None = None,
    api: client.ApiClient | None = None,
) -> TokenReviewer | None:
    """The reviewer per RIG_K8S_AGENT_AUTH, or None when agent auth is off.

    `api` is an existing client to share (the pod evidence's); without one, the client comes
    from in-cluster configuration, else KUBECONFIG. Raises `kubernetes.KubernetesConfigError`
    when neither is usable: an operator mistake (`startup_problem` words it for exit 2).
    """
    if not settings.k8s_agent_auth:
        return None
    if api is None:
        api = kubernetes.api_client(environ=environ)
    return TokenReviewer(api, audience=settings.k8s_token_audience, namespace=settings.namespace())


def startup_problem(settings: Settings, *, environ: Mapping[str, str]) -> str | None:
    """One line naming RIG_K8S_AGENT_AUTH when it is on and Kubernetes is unusable, else None."""
    if not settings.k8s_agent_auth:
        return None
    try:
        kubernetes.api_client(environ=environ).close()
    except kubernetes.KubernetesConfigError as exc:
        return f"RIG_K8S_AGENT_AUTH=true, but {exc}"
    return None


def _token_text(token: bytes) -> str:
    if not token or len(token) > MAX_TOKEN_BYTES:
        raise Unauthenticated("the token is empty or too long to be a ServiceAccount token")
    try:
        text = token.decode("ascii")
    except UnicodeDecodeError:
        raise Unauthenticated("the token is not ASCII, so not a ServiceAccount token") from None
    if not text.isprintable() or " " in text:
        raise Unauthenticated("the token has characters no ServiceAccount token has")
    return text
