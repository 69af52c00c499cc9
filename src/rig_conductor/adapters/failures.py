"""Which exceptions mean "a dependency is down", for layers that must not know the drivers."""

from __future__ import annotations

import psycopg
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

# Redis or PostgreSQL unreachable, timing out or refusing: the caller answers 503 and retries.
UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisError,
    SQLAlchemyError,
    psycopg.OperationalError,
    OSError,
)


def which(exc: BaseException) -> str:
    """`Redis` or `PostgreSQL`: the dependency an UNAVAILABLE error came from."""
    return "Redis" if isinstance(exc, RedisError) else "PostgreSQL"
