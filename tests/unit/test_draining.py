"""`DrainBeforeAnswer`: when it reads the rest of a body before an answer, and when it must not.

Through the real server, `tests/integration/test_serve_http.py` shows the answers reaching a
client still sending. Here, spoken in ASGI messages, the cases a server run cannot tell apart:
a read too many waits on the connection, and a read of an `Expect: 100-continue` body invites
its upload.
"""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive, Scope, Send

from rig_conductor.api.draining import DRAIN_BYTES, DrainBeforeAnswer


def http(*headers: tuple[bytes, bytes]) -> Scope:
    return {"type": "http", "method": "POST", "path": "/api/events", "headers": list(headers)}


class Client:
    """A client's side: the body in `pieces`, and what it was asked for and answered."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.reads = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        self.reads += 1
        if not self.pieces:  # nothing more will come: a server reading now waits forever
            await asyncio.sleep(3600)
        body = self.pieces.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(self.pieces)}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def refuse_at_once(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 401, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def read_all_then_answer(scope: Scope, receive: Receive, send: Send) -> None:
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 202, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def run(app: object, scope: Scope, client: Client) -> None:
    middleware = DrainBeforeAnswer(app)  # type: ignore[arg-type]
    await asyncio.wait_for(middleware(scope, client.receive, client.send), timeout=5)


async def test_an_unread_body_is_taken_before_the_answer_starts() -> None:
    for framing in ((b"content-length", b"30"), (b"transfer-encoding", b"chunked")):
        client = Client([b"a" * 10, b"b" * 10, b"c" * 10])
        await run(refuse_at_once, http(framing), client)
        assert client.pieces == [], framing
        assert client.sent[0]["status"] == 401


async def test_a_body_the_app_read_is_not_read_again() -> None:
    client = Client([b"a" * 10, b"b" * 10])
    await run(read_all_then_answer, http((b"content-length", b"20")), client)
    assert client.reads == 2
    assert client.sent[0]["status"] == 202


async def test_a_request_without_a_body_is_never_read() -> None:
    for headers in ([], [(b"content-length", b"0")]):
        client = Client([])
        await run(refuse_at_once, http(*headers), client)
        assert client.reads == 0, headers


async def test_a_body_announced_with_expect_continue_and_not_asked_for_stays_unsent() -> None:
    client = Client([b"a" * 10])
    await run(
        refuse_at_once, http((b"content-length", b"10"), (b"expect", b"100-continue")), client
    )
    assert client.reads == 0


async def test_a_declared_body_past_the_drain_bound_is_answered_at_once() -> None:
    client = Client([b"a" * 10])
    await run(refuse_at_once, http((b"content-length", str(DRAIN_BYTES + 1).encode())), client)
    assert client.reads == 0


async def test_a_chunked_body_is_read_no_further_than_the_bound() -> None:
    piece = b"a" * (64 * 1024)
    client = Client([piece] * (DRAIN_BYTES // len(piece) + 10))
    await run(refuse_at_once, http((b"transfer-encoding", b"chunked")), client)
    assert DRAIN_BYTES < client.reads * len(piece) <= DRAIN_BYTES + 2 * len(piece)
    assert client.pieces, "the body past the bound was left unread"
