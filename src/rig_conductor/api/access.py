"""Request-level middleware: the root path, the role guard of /api and the request log.

Plain ASGI rather than FastAPI dependencies: they run on every heartbeat, and a dependency
costs more than the check itself. The request log carries method, path, status, duration and
client, never bodies, queries or headers; successful requests log at DEBUG (heartbeats arrive
by the thousand), anything else at INFO.
"""

from __future__ import annotations

import json
import logging
import math
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rig_conductor import lograte, roles, throttle
from rig_conductor.adapters import token_review
from rig_conductor.domain import ConsumerName

logger = logging.getLogger("rig_conductor.access")
# How long a client should wait after a 503 of the guard's (the Kubernetes API failing).
RETRY_AFTER_S = b"5"


class AccessLog:
    """One line per request; a client's mistakes (4xx) at a bounded rate per status, so a
    flood of refused requests does not flood the log (`lograte`)."""

    def __init__(self, app: ASGIApp, refusal_log: lograte.RateLimitedLog | None = None) -> None:
        self.app = app
        self.refusal_log = refusal_log or lograte.RateLimitedLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app dies before answering

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            level = logging.DEBUG if status < 400 else logging.INFO
            if logger.isEnabledFor(level):
                self._log(scope, level, status, round((time.perf_counter() - started) * 1000, 1))

    def _log(self, scope: Scope, level: int, status: int, duration_ms: float) -> None:
        client = scope.get("client")
        args = (scope["method"], scope["path"], status, duration_ms)
        extra = {
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "durationMs": duration_ms,
            "client": client[0] if client else None,
        }
        if 400 <= status < 500:
            self.refusal_log.log(logger, level, f"HTTP {status}", _LINE, *args, extra=extra)
        else:
            logger.log(level, _LINE, *args, extra=extra)


_LINE = "%s %s %d %.1fms"


# Wrong tokens a client may present in a row before it must wait (1 s, doubling up to 60 s).
API_FREE_FAILURES = 5


class RoleGuard:
    """With any role's tokens set, every /api call needs `Authorization: Bearer <token>`: 401
    without a valid one, 403 when the token's role may not do what the request asks
    (`roles.api_need`). The caller goes into the request state for the routes' audit lines.

    A client (by address) that keeps presenting wrong tokens gets 429 with Retry-After instead
    of 401 while `failed_tokens` makes it wait. The token is checked first, so a valid token is
    never refused, and the throttle is touched only on a failure: a heartbeat with a valid
    token costs what it did before.

    With a `reviewer` (RIG_K8S_AGENT_AUTH), a bearer token that is none of the configured ones
    may be a pod's ServiceAccount token: a TokenReview (cached) decides. A review that says no
    is a wrong token (401, and counted); a Kubernetes API that cannot answer is 503 with
    Retry-After, never 401: its outage must not look like a forgery. The throttle comes before
    the review: a client in its 429 window costs the API server nothing (only a token a review
    accepted lately, still cached, passes without asking), and a token that is not a JWT is
    never sent to a review at all (`token_review.looks_like_jwt`).
    """

    def __init__(
        self,
        app: ASGIApp,
        tokens: roles.Tokens,
        failed_tokens: throttle.FailureThrottle,
        reviewer: token_review.TokenReviewer | None = None,
        refusal_log: lograte.RateLimitedLog | None = None,
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.failed_tokens = failed_tokens
        self.reviewer = reviewer
        self.refusal_log = refusal_log or lograte.RateLimitedLog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        if not path.startswith("/api/"):
            await self.app(scope, receive, send)
            return
        caller = roles.ANONYMOUS
        if not self.tokens.open:
            authorization = header(scope, b"authorization")
            scheme, _, presented = (authorization or b"").partition(b" ")
            token = presented.strip()
            found = self._caller(scheme, token)
            if found is None and self.reviewer is not None and scheme.lower() == b"bearer":
                found = self._known_pod(token)
                if found is None:
                    if await self._throttled(scope, send):
                        return  # in its 429 window: no TokenReview is spent on this client
                    try:
                        found = await self._pod(token)
                    except token_review.ReviewUnavailable as exc:
                        logger.warning("TokenReview failed, answering 503: %s", exc)
                        detail = "the Kubernetes API cannot review the token now; retry later"
                        await answer(send, 503, detail, [(b"retry-after", RETRY_AFTER_S)])
                        return
            if found is None:
                await self._refuse(scope, send, presented=authorization is not None)
                return
            caller = found
        need = roles.api_need(scope["method"], path)
        if not self.tokens.allows(caller, need):
            await answer(send, 403, f"the {caller.role.name.lower()} role may not do this")
            return
        scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, *, presented: bool) -> None:
        """401, or 429 while this client must wait; only a presented token counts as a failure
        (a request without one guesses nothing)."""
        if presented:
            if await self._throttled(scope, send):
                return
            self.failed_tokens.failed(client_address(scope))
        await answer(
            send, 401, "missing or invalid bearer token", [(b"www-authenticate", b"Bearer")]
        )

    async def _throttled(self, scope: Scope, send: Send) -> bool:
        """Answers 429 with Retry-After (and says True) while this client must wait."""
        wait = self.failed_tokens.wait_s(client_address(scope))
        if wait <= 0:
            return False
        seconds = str(math.ceil(wait))
        detail = f"too many invalid tokens from this address; retry in {seconds} s"
        await answer(send, 429, detail, [(b"retry-after", seconds.encode())])
        return True

    def _known_pod(self, presented: bytes) -> roles.Caller | None:
        """The pod of a ServiceAccount token a review accepted lately: honoured before the
        throttle is asked, so a pod that proved itself is never refused with 429."""
        assert self.reviewer is not None
        identity = self.reviewer.accepted(presented)
        if identity is None:
            return None
        return roles.pod(ConsumerName(identity.pod), identity.namespace)

    def _caller(self, scheme: bytes, presented: bytes) -> roles.Caller | None:
        caller = self.tokens.caller(presented)
        return caller if scheme.lower() == b"bearer" else None

    async def _pod(self, presented: bytes) -> roles.Caller | None:
        """The pod a ServiceAccount token proves, or None when the review says no."""
        assert self.reviewer is not None
        try:
            identity = await self.reviewer.review(presented)
        except token_review.Unauthenticated as exc:
            self.refusal_log.log(
                logger, logging.INFO, "TokenReview refused", "TokenReview refused a token: %s", exc
            )
            return None
        return roles.pod(ConsumerName(identity.pod), identity.namespace)


class RootPath:
    """Serves the app under RIG_HTTP_ROOT_PATH whether the ingress strips the prefix or not.

    ASGI puts the prefix in both `root_path` and `path`; a request that arrives without it
    (stripped by the ingress) gets it added, so routing, links and redirects see one shape.
    """

    def __init__(self, app: ASGIApp, root_path: str) -> None:
        self.app = app
        self.root_path = root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.root_path and scope["type"] in ("http", "websocket"):
            path: str = scope["path"]
            if path != self.root_path and not path.startswith(self.root_path + "/"):
                scope = {**scope, "path": self.root_path + path}
                if "raw_path" in scope and scope["raw_path"] is not None:
                    scope["raw_path"] = self.root_path.encode() + scope["raw_path"]
            scope = {**scope, "root_path": self.root_path}
        await self.app(scope, receive, send)


async def answer(
    send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A `{"detail": ...}` JSON answer sent straight from middleware, before the app runs."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive() that hands out `messages` first, then defers to the real one: the body a
    middleware read, for the app behind it."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


def client_address(scope: Scope) -> str:
    """The client's address: the connection's peer, or what a trusted proxy forwarded
    (`RIG_FORWARDED_ALLOW_IPS`, applied before this app sees the request)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of header `name` (lower case, as ASGI servers deliver names)."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def route_path(scope: Scope) -> str:
    """The path inside the app: without the root path the ASGI server or `RootPath` set."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path
