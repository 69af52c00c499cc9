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

from rig_conductor import roles, throttle

logger = logging.getLogger("rig_conductor.access")


class AccessLog:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
                client = scope.get("client")
                duration_ms = round((time.perf_counter() - started) * 1000, 1)
                logger.log(
                    level,
                    "%s %s %d %.1fms",
                    scope["method"],
                    scope["path"],
                    status,
                    duration_ms,
                    extra={
                        "method": scope["method"],
                        "path": scope["path"],
                        "status": status,
                        "durationMs": duration_ms,
                        "client": client[0] if client else None,
                    },
                )


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
    """

    def __init__(
        self, app: ASGIApp, tokens: roles.Tokens, failed_tokens: throttle.FailureThrottle
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.failed_tokens = failed_tokens

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
            found = self._caller(authorization or b"")
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
            client = scope.get("client")
            address = client[0] if client else "unknown"
            wait = self.failed_tokens.wait_s(address)
            if wait > 0:
                seconds = str(math.ceil(wait))
                detail = f"too many invalid tokens from this address; retry in {seconds} s"
                await answer(send, 429, detail, [(b"retry-after", seconds.encode())])
                return
            self.failed_tokens.failed(address)
        await answer(
            send, 401, "missing or invalid bearer token", [(b"www-authenticate", b"Bearer")]
        )

    def _caller(self, authorization: bytes) -> roles.Caller | None:
        scheme, _, presented = authorization.partition(b" ")
        caller = self.tokens.caller(presented.strip())
        return caller if scheme.lower() == b"bearer" else None


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
