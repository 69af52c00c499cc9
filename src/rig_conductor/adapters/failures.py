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

import re
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
# SQLAlchemy wraps what the pool's connections raise; the heartbeat writer's own connection
# raises psycopg's errors as they are: OperationalError for a lost or refused connection,
# InterfaceError for one psycopg had already found closed.
UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisError,
    SQLAlchemyError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    OSError,
)
# Error replies from Redis: `judge` says whose fault each is.
REFUSED: tuple[type[Exception], ...] = (ResponseError,)

_BUSY = (ReadOnlyError, ClusterDownError, TryAgainError, OutOfMemoryError)
_BUSY_PREFIXES = ("LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "OOM")
_REQUEST_FAULTS = ("WRONGTYPE", "NOGROUP", "Invalid stream ID", "ERR Invalid stream ID")
_PIPELINE_NOTE = " of pipeline caused error: "
_SCRIPT_NOTE = re.compile(r"^Error running script \(call to [^)]*\): @user_script:\d+: ")

Verdict = Literal["unavailable", "request", "refused"]


class RefusedRequest(Exception):
    """Redis refused what the request named: the client's mistake (422, or a 400 page)."""


def which(exc: BaseException) -> str:
    """`Redis` or `PostgreSQL`: the dependency an UNAVAILABLE error came from."""
    return "Redis" if isinstance(exc, RedisError) else "PostgreSQL"


def judge(exc: BaseException) -> Verdict:
    """For a Redis error reply: `unavailable` (retry later), `request` (what the request named
    cannot be done: the client's fault) or `refused` (Redis refused the conductor's command)."""
    text = reply_text(exc)
    if isinstance(exc, _BUSY) or text.startswith(_BUSY_PREFIXES):
        return "unavailable"
    if text.startswith(_REQUEST_FAULTS):
        return "request"
    return "refused"


def reply_text(exc: BaseException) -> str:
    """The error reply itself, without the note redis-py puts before an error inside a pipeline
    (`Command # 1 (...) of pipeline caused error: ...`) or the one Redis 6.2 puts before an
    error inside a script (`Error running script (...): @user_script:1: ...`)."""
    text = str(exc)
    if text.startswith("Command # ") and _PIPELINE_NOTE in text:
        text = text.split(_PIPELINE_NOTE, 1)[1]
        if text.startswith(("('", '("')) and text.endswith(("',)", '",)')):  # the args' repr
            text = text[2:-3]
    return _SCRIPT_NOTE.sub("", text, count=1)


@contextmanager
def named_by_request() -> Iterator[None]:
    """Redis calls that take what a client named (a stream, a group, an id): a reply refusing
    those names raises `RefusedRequest` instead."""
    try:
        yield
    except ResponseError as exc:
        if judge(exc) == "request":
            raise RefusedRequest(reply_text(exc)) from exc
        raise
