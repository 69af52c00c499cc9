"""The heartbeat's own lane through the app: `POST /api/events` with a valid HEARTBEAT body is
answered here, in plain ASGI, without FastAPI's routing and request handling.

Heartbeats are nearly all of the API's traffic (a fleet of 10,000 pods beating every 10 s sends
1,000 a second), and for a body this small FastAPI's per-request work (matching the route among
all of the app's routes, building a Request, solving the endpoint's parameters, validating a
parsed dict against the union of every event type) costs more than storing the heartbeat does:
measured with `bench/ingest.py`, it was the largest part of the gap to a no-op endpoint.

The lane changes no answer. It runs inside the role guard and the body limit, so a heartbeat is
authenticated and bounded as before; it decides with the route's own function
(`events.heartbeat`); an error is answered by the app's own exception handlers. Everything else
goes on to FastAPI with the body replayed: other event types, a body that does not validate
(FastAPI writes the 422, field by field), a Content-Type other than JSON.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rig_conductor import roles
from rig_conductor.api import schemas
from rig_conductor.api.access import header, replay, route_path
from rig_conductor.api.routes import events

_HEARTBEAT = TypeAdapter(schemas.HeartbeatEvent)


class HeartbeatLane:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _may_be_heartbeat(scope):
            await self.app(scope, receive, send)
            return
        body, ended = await _read(receive)
        event = _heartbeat(body) if ended else None
        if event is None:
            whole: Message = {"type": "http.request", "body": body, "more_body": False}
            await self.app(scope, replay([whole] if ended else [], receive), send)
            return
        app: Any = scope["app"]  # the Starlette app sets itself into the scope first
        caller: roles.Caller = scope.get("state", {}).get("caller", roles.ANONYMOUS)
        try:
            response = await events.heartbeat(event, caller, app.state.runtime)
        except Exception as exc:
            handler = _handler(app.exception_handlers, exc)
            if handler is None:
                raise
            response = await handler(Request(scope), exc)
        await response(scope, receive, send)


def _may_be_heartbeat(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    if route_path(scope) != "/api/events":
        return False
    content_type = header(scope, b"content-type") or b""
    return content_type.split(b";")[0].strip().lower() == b"application/json"


def _heartbeat(body: bytes) -> schemas.HeartbeatEvent | None:
    """The body as a heartbeat, or None: not one, or not a valid one (FastAPI says why)."""
    if b'"HEARTBEAT"' not in body:
        return None
    try:
        return _HEARTBEAT.validate_json(body)
    except ValueError:  # ValidationError, and a body that is not UTF-8 text
        return None


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The request body; False when the client went away before the end of it."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _handler(handlers: dict[Any, Any], exc: Exception) -> Any:
    """The app's exception handler for `exc`: the most specific class, as Starlette picks."""
    for kind in type(exc).__mro__:
        if kind in handlers:
            return handlers[kind]
    return None
