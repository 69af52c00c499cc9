"""Error answers: 422 naming the field, 413 over the body limit, 503 when a dependency is down.

Nothing a client sends produces a 500 (or a 503: a Redis error reply caused by what the request
named is a 422). The console's requests (under /ui) get the same statuses as a page of the
console (`Pages`), its bad input as a 400.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rig_conductor import lograte, roles, throttle
from rig_conductor.adapters import failures, token_review
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.api.access import (
    API_FREE_FAILURES,
    AccessLog,
    RoleGuard,
    RootPath,
    answer,
    header,
    replay,
    route_path,
)
from rig_conductor.api.draining import DrainBeforeAnswer
from rig_conductor.domain import EventKind, NotLeading

logger = logging.getLogger(__name__)

# Renders an error of a console request as a page: (request, status, message) -> response.
Pages = Callable[[Request, int, str], Response]

MAX_BODY_BYTES = 64 * 1024
RETRY_AFTER_S = "5"
# pydantic puts the union member's tag into the location: it names no field of the request.
_TAGS = {
    EventKind.HEARTBEAT,
    EventKind.ISSUE_ASSIGNED,
    EventKind.WORK_STARTED,
    EventKind.WORK_PROGRESS,
    EventKind.WORK_COMPLETED,
    EventKind.WORK_FAILED,
    EventKind.WORK_PUBLISHED,
    EventKind.DEAD_LETTER,
}


def field_of(location: tuple[Any, ...] | list[Any]) -> str:
    parts = [
        str(p) for p in location if p not in ("body", *_TAGS) and not str(p).startswith("function-")
    ]
    return ".".join(parts) or "body"


def _console(request: Request) -> Pages | None:
    """The console's error pages, for a request under /ui (None for the API)."""
    pages: Pages | None = getattr(request.app.state, "error_pages", None)
    if pages is not None and route_path(request.scope).startswith("/ui"):
        return pages
    return None


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "field": "body" if e["type"] == "json_invalid" else field_of(e["loc"]),
            "message": e["msg"],
            "type": e["type"],
        }
        for e in exc.errors()
    ]
    pages = _console(request)
    content_type = request.headers.get("content-type", "")
    body_failed = any(e["loc"] and e["loc"][0] == "body" for e in exc.errors())
    if body_failed and "json" not in content_type and pages is None:
        errors.insert(
            0,
            {
                "field": "body",
                "message": "expected a JSON body with Content-Type: application/json, "
                f"got {content_type!r}",
                "type": "content_type",
            },
        )
    first = errors[0] if errors else {"field": "body", "message": "invalid request"}
    if pages is not None:  # a form of the console
        return pages(request, 400, f"Bad request: {first['field']}: {first['message']}")
    return JSONResponse(
        status_code=422,
        content={"detail": f"{first['field']}: {first['message']}", "errors": errors},
    )


async def _unavailable(request: Request, exc: Exception) -> Response:
    which = failures.which(exc)
    logger.warning(
        "%s %s answered 503: %s unavailable: %s", request.method, request.url.path, which, exc
    )
    return _answer(request, 503, f"{which} is unavailable; retry later")


async def _redis_refused(request: Request, exc: Exception) -> Response:
    """A Redis error reply: an outage only when it says so."""
    if failures.judge(exc) == "unavailable":
        return await _unavailable(request, exc)
    logger.error(
        "%s %s answered 503: Redis refused a command: %s", request.method, request.url.path, exc
    )
    return _answer(request, 503, "Redis refused a command; see the conductor's log")


async def _refused_request(request: Request, exc: Exception) -> Response:
    """Redis refused what the client named (`failures.named_by_request`): the client's mistake."""
    _refusal_log(request).log(
        logger, logging.INFO, "Redis refused", "%s %s answered 422: Redis refused: %s",
        request.method, request.url.path, exc,
    )  # fmt: skip
    return _client_mistake(request, f"Redis refused the request: {exc}")


async def _bad_stream_name(request: Request, exc: Exception) -> Response:
    """A stream name the key helpers cannot work with (`redis_keys.BadStreamName`)."""
    _refusal_log(request).log(
        logger, logging.INFO, "Bad stream name", "%s %s answered 422: %s",
        request.method, request.url.path, exc,
    )  # fmt: skip
    return _client_mistake(request, str(exc))


def _refusal_log(request: Request) -> lograte.RateLimitedLog:
    """The app's bounded log of refusals (a fresh one for an app built without it)."""
    found = getattr(request.app.state, "refusal_log", None)
    if found is None:
        found = request.app.state.refusal_log = lograte.RateLimitedLog()
    assert isinstance(found, lograte.RateLimitedLog)
    return found


def _client_mistake(request: Request, detail: str) -> Response:
    if (pages := _console(request)) is not None:
        return pages(request, 400, detail)
    return JSONResponse(status_code=422, content={"detail": detail})


def _answer(request: Request, status: int, detail: str) -> Response:
    headers = {"Retry-After": RETRY_AFTER_S} if status == 503 else {}
    if (pages := _console(request)) is not None:
        response = pages(request, status, detail)
        response.headers.update(headers)
        return response
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


async def _http_error(request: Request, exc: Exception) -> JSONResponse | Any:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's answer to bytes that are not even text; to a client that is malformed JSON.
        message = "not valid JSON (the bytes are not UTF-8 text)"
        return JSONResponse(
            status_code=422,
            content={
                "detail": f"body: {message}",
                "errors": [{"field": "body", "message": message, "type": "json_invalid"}],
            },
        )
    return await http_exception_handler(request, exc)


async def _not_leading(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(status_code=409, content={"detail": str(exc)})


def install(
    app: FastAPI,
    *,
    tokens: roles.Tokens,
    root_path: str = "",
    reviewer: token_review.TokenReviewer | None = None,
    refusal_log: lograte.RateLimitedLog | None = None,
) -> None:
    refusal_log = refusal_log or lograte.RateLimitedLog()
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(NotLeading, _not_leading)
    app.add_exception_handler(failures.RefusedRequest, _refused_request)
    app.add_exception_handler(redis_keys.BadStreamName, _bad_stream_name)
    for error in failures.UNAVAILABLE:
        app.add_exception_handler(error, _unavailable)
    for error in failures.REFUSED:  # more specific than RedisError: chosen first
        app.add_exception_handler(error, _redis_refused)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)
    # Before the body is read. One throttle of wrong tokens per app, in its state so tests can
    # drive its clock.
    app.state.api_throttle = throttle.FailureThrottle(free=API_FREE_FAILURES)
    app.add_middleware(
        RoleGuard,
        tokens=tokens,
        failed_tokens=app.state.api_throttle,
        reviewer=reviewer,
        refusal_log=refusal_log,
    )
    app.add_middleware(AccessLog, refusal_log=refusal_log)  # sees 401s, 403s and 413s too
    app.add_middleware(RootPath, root_path=root_path)
    # Added last: outside every layer that may answer before the body is read (413, 401, 403,
    # 429, 503), so the rest of it is taken first and the answer is not lost to a reset.
    app.add_middleware(DrainBeforeAnswer)


class BodyLimit:
    """Answers 413 to a request body over `limit` bytes, declared or streamed.

    A declared Content-Length is checked up front; within the limit, the HTTP server (h11 or
    httptools) delivers no more than it declares, so the body passes through untouched. A body
    without one (chunked) is read here, at most `limit` bytes, and replayed to the app: an error
    raised from inside the app's own body reading would surface as a 400 instead.

    The rest of a refused body is read before the 413 goes out, outside (`DrainBeforeAnswer`).
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.limit:
                await self._refuse(send)
            else:
                await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, replay([body], receive), send)

    async def _refuse(self, send: Send) -> None:
        await answer(send, 413, f"request body over {self.limit} bytes")
