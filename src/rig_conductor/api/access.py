"""Request log: method, path, status, duration and client; never bodies, queries or headers.

Successful requests log at DEBUG (heartbeats arrive by the thousand); anything else at INFO.
"""

from __future__ import annotations

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
