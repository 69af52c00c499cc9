"""Request-level middleware: the bearer-token guard of /api and the request log.

Plain ASGI rather than FastAPI dependencies: they run on every heartbeat, and a dependency
costs more than the check itself. The request log carries method, path, status, duration and
client, never bodies, queries or headers; successful requests log at DEBUG (heartbeats arrive
by the thousand), anything else at INFO.
"""

from __future__ import annotations

import hmac
import json
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class BearerTokens:
    """With RIG_API_TOKENS set, every /api call needs `Authorization: Bearer <token>`; 401 else.

    Every token is compared in constant time, so timing tells nothing about which came close.
    """

    def __init__(self, app: ASGIApp, tokens: tuple[bytes, ...]) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._refused(scope):
            await answer(
                send, 401, "missing or invalid bearer token", [(b"www-authenticate", b"Bearer")]
            )
            return
        await self.app(scope, receive, send)

    def _refused(self, scope: Scope) -> bool:
        if scope["type"] != "http" or not self.tokens or not scope["path"].startswith("/api/"):
            return False
        return not self._allowed(header(scope, b"authorization") or b"")

    def _allowed(self, authorization: bytes) -> bool:
        scheme, _, presented = authorization.partition(b" ")
        candidate = presented.strip()
        matched = False
        for token in self.tokens:
            matched |= hmac.compare_digest(candidate, token)
        return scheme.lower() == b"bearer" and matched


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
