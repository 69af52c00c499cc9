"""Which exceptions mean "a dependency is down", for layers that must not know the drivers.

A Redis error reply is not an outage by itself: Redis answered. Only replies that say it cannot
serve now (loading, read-only after a failover, out of memory, cluster down) are. One that
refuses what a request named (a key that is not a stream, no such group, an id it cannot
parse) is the client's fault when the client named it: code that sends a client's names to
Redis runs inside `named_by_request`, which turns those replies into `RefusedRequest`. Any
other reply (a missing ACL permission, the configured dispatch stream holding a string) is a
refusal the operator must look into.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import psycopg
from redis.exceptions import (
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from sqlalchemy.exc import SQLAlchemyError

# Redis or PostgreSQL unreachable, timing out or refusing: the caller answers 503 and retries.
UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisError,
    SQLAlchemyError,
    psycopg.OperationalError,
    OSError,
)
# Error replies from Redis: `judge` says whose fault each is.
REFUSED: tuple[type[Exception], ...] = (ResponseError,)

_BUSY = (ReadOnlyError, ClusterDownError, TryAgainError, OutOfMemoryError)
_BUSY_PREFIXES = ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM")
_REQUEST_FAULTS = ("WRONGTYPE", "NOGROUP", "Invalid stream ID", "ERR Invalid stream ID")

Verdict = Literal["unavailable", "request", "refused"]


class RefusedRequest(Exception):
    """Redis refused what the request named: the client's mistake (422, or a 400 page)."""


def which(exc: BaseException) -> str:
    """`Redis` or `PostgreSQL`: the dependency an UNAVAILABLE error came from."""
    return "Redis" if isinstance(exc, RedisError) else "PostgreSQL"


def judge(exc: BaseException) -> Verdict:
    """For a Redis error reply: `unavailable` (retry later), `request` (what the request named
    cannot be done: the client's fault) or `refused` (Redis refused the conductor's command)."""
    text = str(exc)
    if isinstance(exc, _BUSY) or text.startswith(_BUSY_PREFIXES):
        return "unavailable"
    if text.startswith(_REQUEST_FAULTS):
        return "request"
    return "refused"


@contextmanager
def named_by_request() -> Iterator[None]:
    """Redis calls that take what a client named (a stream, a group, an id): a reply refusing
    those names raises `RefusedRequest` instead."""
    try:
        yield
    except ResponseError as exc:
        if judge(exc) == "request":
            raise RefusedRequest(str(exc)) from exc
        raise
