"""Read what is left of a request body before any answer goes out.

A server that answers and closes while the client is still sending resets the connection (TCP
RST): the rest of the body reaches a closed socket, and the client sees "connection reset"
where the answer should be. Any answer given before the body is read has that risk: the role
guard's 401, 403, 429 and 503 come from the head alone, the 413 from the declared size. One
middleware, outside all of them, takes the rest of the body first, so every answer reaches the
client whoever gave it.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rig_conductor.api.access import header

# The most of a body read only to be dropped. Past this the answer goes at once, and a client
# still sending may see the reset.
DRAIN_BYTES = 1024 * 1024


class DrainBeforeAnswer:
    """Drains an unread request body (up to `DRAIN_BYTES`) when the app starts its answer.

    A request has a body only when its head frames one (Content-Length or Transfer-Encoding);
    one without is never read here, so a GET costs nothing and its app's own waiting on the
    connection is never raced. A body announced with `Expect: 100-continue` and not yet asked
    for is left unsent: reading it would invite the client to upload what is already refused.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        taken = 0
        ended = False  # the body's end (or the client's going away) was seen
        asked = False  # the app called receive(): a 100 Continue, if one was due, has gone

        async def tracked() -> Message:
            nonlocal taken, ended, asked
            asked = True
            message = await receive()
            if message["type"] != "http.request":
                ended = True
            else:
                taken += len(message.get("body", b""))
                ended = not message.get("more_body", False)
            return message

        async def answering(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start" and not ended:
                ended = True  # drained or given up on: never read again
                if _worth_draining(scope, taken, asked):
                    await drain(receive)
            await send(message)

        await self.app(scope, tracked, answering)


def _has_body(scope: Scope) -> bool:
    length = header(scope, b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return header(scope, b"transfer-encoding") is not None


def _worth_draining(scope: Scope, taken: int, asked: bool) -> bool:
    if not asked and header(scope, b"expect") is not None:
        return False  # `Expect: 100-continue`: the client waits to be asked; it is not
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit():
        return int(declared) - taken <= DRAIN_BYTES
    return True  # chunked: read up to the bound


async def drain(receive: Receive) -> None:
    """Reads and drops the rest of a request body until its end, the client's going away, or
    `DRAIN_BYTES`."""
    dropped = 0
    while dropped <= DRAIN_BYTES:
        message = await receive()
        if message["type"] != "http.request":
            return
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
