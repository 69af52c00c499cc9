"""A small HTTP proxy in front of the conductors, as a Kubernetes Service stands in front of the
replicas of a rolling upgrade: each request goes to the next backend in turn, and every answer
(or failure to get one) is recorded, so a test can say that no agent and no dispatcher got a 5xx.

It runs in the test's own event loop (uvicorn), forwarding with httpx. A backend is taken out of
the rotation before its process is stopped, as an endpoint leaves a Service before its pod is
sent SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn

from tests.integration.helpers import free_port, wait_for

# Hop-by-hop headers, and the ones httpx has already acted on (it decodes the body).
_DROPPED = {b"host", b"connection", b"content-length", b"transfer-encoding", b"content-encoding"}


@dataclass(frozen=True)
class Answer:
    backend: str
    method: str
    path: str
    status: int
    body: str


@dataclass
class Proxy:
    url: str = ""
    backends: list[str] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    _turn: int = 0
    _client: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=30))

    def served_by(self, backend: str) -> int:
        return sum(1 for a in self.answers if a.backend == backend)

    def failures(self) -> list[Answer]:
        """Answers an agent or a dispatcher of the previous release would not have had."""
        return [a for a in self.answers if a.status >= 500]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        backend = self.backends[self._turn % len(self.backends)]
        self._turn += 1
        target = backend + scope["raw_path"].decode()
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _DROPPED]
        try:
            answer = await self._client.request(
                scope["method"], target, content=body, headers=headers
            )
            status, content = answer.status_code, answer.content
            out = [(k, v) for k, v in answer.headers.raw if k.lower() not in _DROPPED]
        except httpx.TransportError as exc:
            status, content, out = 502, f"proxy: {exc!r}".encode(), []
        self.answers.append(
            Answer(
                backend,
                scope["method"],
                scope["path"],
                status,
                content[:500].decode("utf-8", "replace"),
            )
        )
        out.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": content})


@contextlib.asynccontextmanager
async def running_proxy() -> AsyncIterator[Proxy]:
    proxy = Proxy()
    port = free_port()
    proxy.url = f"http://127.0.0.1:{port}"
    config = uvicorn.Config(
        proxy, host="127.0.0.1", port=port, lifespan="off", log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_for(lambda: server.started, within=10)
        yield proxy
    finally:
        server.should_exit = True
        await task
        await proxy._client.aclose()
