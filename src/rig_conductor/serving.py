"""The HTTP server `serve` runs the app on: uvicorn on httptools and uvloop, the request head
bounded. It chooses the server and its limits; it must not decide any answer (that is `app.py`'s).

uvicorn's own default is h11 on asyncio's loop: pure Python, and under a fleet's heartbeats
the largest part of a request's CPU went to h11 parsing the request and writing the answer.
httptools (llhttp, Node's parser, in C) and uvloop (libuv) are uvicorn's fast path.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The most a request's head (request line and headers) may take before its end is seen. h11 held
# a head to about 16 KiB of unparsed bytes; llhttp sets no limit of its own, so without this a
# client could send headers until the process runs out of memory. Generous for bearer tokens
# and cookies; of the order of the body limit (api.errors.MAX_BODY_BYTES).
MAX_HEAD_BYTES = 64 * 1024


class HttpToolsBounded(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 400 to a request head over `MAX_HEAD_BYTES`.

    Counts the bytes received while a head is incomplete: from the end of one request (or the
    connection's start) until the parser reports the headers complete. A read that ends one
    request and starts the next does not count toward the next; that misses at most one read.
    """

    _head_bytes = 0
    _in_head = True

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.logger.warning("Request head over %d bytes: refused", MAX_HEAD_BYTES)
            self.send_400_response("Request header fields too large.")

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0


def event_loop() -> str:
    """uvloop where it is installed: every platform but Windows, which it does not support (the
    dependency's marker in pyproject.toml); asyncio's own loop there."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def config(app: Any, *, host: str, port: int, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for `app` as `serve` runs it; `overrides` (a benchmark's other
    server stack) replace any of its arguments.

    The protocol and the loop are named, not left to uvicorn's "auto", which takes them when
    they import and falls back to h11 and asyncio silently: an install without httptools must
    fail at start, not serve at a fraction of the speed.
    """
    arguments: dict[str, Any] = {
        "http": HttpToolsBounded,
        "loop": event_loop(),
        "log_config": None,  # keep our dictConfig (text or JSON) for uvicorn's records too
        "access_log": False,
        # Forwarding headers are the app's to believe, from RIG_FORWARDED_ALLOW_IPS only
        # (`app.create_app`). uvicorn's own handling would trust 127.0.0.1 (or whatever its
        # FORWARDED_ALLOW_IPS says) by default: off, whatever the environment.
        "proxy_headers": False,
        "lifespan": "on",
        "timeout_graceful_shutdown": 30,
    }
    return uvicorn.Config(app, host=host, port=port, **(arguments | overrides))
