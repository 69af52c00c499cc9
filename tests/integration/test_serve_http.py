"""`rig-conductor serve` on the wire: what its HTTP server (httptools, `serving.py`) answers
before and around the app, spoken byte by byte over a socket.

The same answers through the app alone (httpx's ASGI transport) are in `test_api.py` and
`test_heartbeat_lane.py`; here they must hold through the server `serve` really runs.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import serving

from .helpers import heartbeats_stored, serve

BEAT = json.dumps({"type": "HEARTBEAT", "agentId": "dev-e", "consumer": "dev-e-0"}).encode()


async def exchange(url: str, request: bytes) -> tuple[int, bytes]:
    """One request written as given, on a connection of its own: the answer's status and body
    (read to the end of the connection, which `Connection: close` asks for)."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=20)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def post(path: str, body_frames: bytes, *headers: bytes) -> bytes:
    lines = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: conductor", *headers]
    lines += [b"Content-Type: application/json", b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body_frames


def chunked(body: bytes, size: int) -> bytes:
    chunks = [body[start : start + size] for start in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\n\r\n"


async def send_slowly(url: str, head: bytes, body: bytes, piece: int) -> bytes:
    """`head`, then `body` in pieces of `piece` bytes with pauses, as a slow client sends it:
    the whole answer, read to the end of the connection."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(head)
        for start in range(0, len(body), piece):
            await asyncio.sleep(0.05)  # time for a server that answers early to close
            writer.write(body[start : start + piece])
            await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=20)
    finally:
        writer.close()


async def test_chunked_heartbeats_are_taken_and_bounded_through_serve(
    redis_url: str, database_url: str, engine: AsyncEngine
) -> None:
    """A heartbeat in many chunks is stored once, under the root path or not; a body over the
    limit answers 413, declared or chunked, and stores nothing."""
    te = b"Transfer-Encoding: chunked"
    async with serve(redis_url, database_url, RIG_HTTP_ROOT_PATH="/rig") as conductor:
        for path in ("/rig/api/events", "/api/events"):
            status, body = await exchange(conductor.url, post(path, chunked(BEAT, 7), te))
            assert (status, json.loads(body)) == (202, {"accepted": True}), body
        assert await heartbeats_stored(engine) == 2  # a 202 is sent once the beat is stored
        big = b'{"type":"HEARTBEAT","agentId":"' + b"a" * 70_000 + b'"}'
        status, body = await exchange(conductor.url, post("/api/events", chunked(big, 8192), te))
        assert status == 413, body
        length = b"Content-Length: %d" % len(big)
        status, body = await exchange(conductor.url, post("/api/events", big, length))
        assert status == 413, body
        assert await heartbeats_stored(engine) == 2


async def test_a_refused_body_still_being_sent_gets_its_413_not_a_reset(
    redis_url: str, database_url: str
) -> None:
    """A client still writing a body over the limit when the server has decided to refuse it
    reads the 413: the server takes the rest of the body before it answers and closes. Answered
    at once, the rest reached a closed socket and the client got "connection reset" (TCP RST),
    for the body declared and for the body chunked alike."""
    big = b'{"type":"HEARTBEAT","agentId":"' + b"a" * 200_000 + b'"}'
    framings = {
        b"Content-Length: %d" % len(big): big,
        b"Transfer-Encoding: chunked": chunked(big, 8192),
    }
    async with serve(redis_url, database_url) as conductor:
        for framing, body in framings.items():
            head = post("/api/events", b"", framing)
            answer = await send_slowly(conductor.url, head, body, 20_000)
            assert answer.startswith(b"HTTP/1.1 413 "), (framing, answer[:200])


async def test_a_body_over_the_limit_announced_with_expect_continue_is_refused_unsent(
    redis_url: str, database_url: str
) -> None:
    """A client that asks before sending (`Expect: 100-continue`) a body over the limit is
    answered 413 at once: not invited to send it (100 Continue) only to have it refused."""
    async with serve(redis_url, database_url) as conductor:
        address = urlsplit(conductor.url)
        reader, writer = await asyncio.open_connection(address.hostname, address.port)
        try:
            head = post("/api/events", b"", b"Content-Length: 200000", b"Expect: 100-continue")
            writer.write(head)
            await writer.drain()
            status_line = await asyncio.wait_for(reader.readline(), timeout=20)
        finally:
            writer.close()
        assert status_line.startswith(b"HTTP/1.1 413 "), status_line


async def test_the_server_refuses_ambiguous_framing_and_endless_heads(
    redis_url: str, database_url: str, engine: AsyncEngine
) -> None:
    """httptools' parser refuses a body framed two ways (Content-Length and chunked), which h11
    takes by the chunks: a proxy in front that went by the length would read a different
    request there (request smuggling). A head past `serving.MAX_HEAD_BYTES` is refused before
    it is held in memory. Both are answered 400 without reaching the app, logged in the
    conductor's own format, and the server goes on serving."""
    async with serve(redis_url, database_url, RIG_LOG_FORMAT="json") as conductor:
        framed_twice = post(
            "/api/events",
            chunked(BEAT, 16),
            b"Content-Length: %d" % len(BEAT),
            b"Transfer-Encoding: chunked",
        )
        status, _ = await exchange(conductor.url, framed_twice)
        assert status == 400
        # Headers that go on and on: the head has no end yet when the bound is passed.
        endless = b"".join(b"X-Padding-%d: %s\r\n" % (n, b"p" * 1000) for n in range(70))
        assert len(endless) > serving.MAX_HEAD_BYTES
        status, body = await exchange(conductor.url, b"GET /healthz HTTP/1.1\r\n" + endless)
        assert (status, body) == (400, b"Request header fields too large.")
        status, body = await exchange(
            conductor.url, post("/api/events", BEAT, b"Content-Length: %d" % len(BEAT))
        )
        assert status == 202, body
        assert await heartbeats_stored(engine) == 1
        logged = [json.loads(line) for line in conductor.stderr.splitlines() if line.strip()]
        refusals = [r["message"] for r in logged if r.get("logger") == "uvicorn.error"]
        assert "Invalid HTTP request received." in refusals, conductor.stderr[-2000:]
        assert f"Request head over {serving.MAX_HEAD_BYTES} bytes: refused" in refusals


async def test_a_refusal_before_the_body_is_read_reaches_a_client_still_sending(
    redis_url: str, database_url: str
) -> None:
    """The role guard answers 401, 403 and 429 from the head alone, before the app reads the
    body. A client still writing that body reads the answer, not "connection reset": the
    server takes the rest of the body before it answers and closes."""
    body = b'{"type":"HEARTBEAT","agentId":"' + b"a" * 60_000 + b'"}'  # within the limit
    viewer = "viewer-token-000000000001"
    env = {"RIG_API_TOKENS": "api-token-0000000000001", "RIG_VIEWER_TOKENS": viewer}
    async with serve(redis_url, database_url, **env) as conductor:

        async def slowly(*headers: bytes) -> bytes:
            head = post("/api/events", b"", b"Content-Length: %d" % len(body), *headers)
            answer = await send_slowly(conductor.url, head, body, 15_000)
            return answer.split(b"\r\n", 1)[0]

        assert await slowly() == b"HTTP/1.1 401 Unauthorized"
        assert await slowly(b"Authorization: Bearer " + viewer.encode()) == (
            b"HTTP/1.1 403 Forbidden"
        )
        wrong = b"Authorization: Bearer wrong-token-00000000001"
        answers = [await slowly(wrong) for _ in range(6)]  # the sixth wrong token in a row waits
        assert answers == [b"HTTP/1.1 401 Unauthorized"] * 5 + [b"HTTP/1.1 429 Too Many Requests"]
