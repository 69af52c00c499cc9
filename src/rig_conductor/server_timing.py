"""`Server-Timing: app;dur=<ms>` on every console page and every `/api` view: how long the
server took to produce the answer, headers included, as a browser's developer tools and the
benchmarks (`bench/console.py`, `bench/scale.py`) read it. Not on the agents' `/api/events`,
the hot path, where nobody reads it."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def timed_path(path: str) -> bool:
    """Whether an answer to `path` (after any root path) carries the header."""
    return "/ui" in path or ("/api/" in path and not path.endswith("/api/events"))


class ServerTiming:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not timed_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                took = (time.perf_counter() - started) * 1000
                headers = [
                    *message.get("headers", []),
                    (b"server-timing", f"app;dur={took:.1f}".encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed)
