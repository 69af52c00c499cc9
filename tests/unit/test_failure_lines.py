"""The one line an operator reads when Redis or PostgreSQL cannot be reached: it names the
variable to fix and, where the fix is known, says it. Table-driven over the exceptions the
drivers raise (their text as psycopg and redis-py write it)."""

from __future__ import annotations

import psycopg
import pytest
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy.exc import OperationalError

from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.redis import access as redis_access


def wrapped(message: str) -> OperationalError:
    """What SQLAlchemy raises around psycopg's error."""
    return OperationalError("SELECT 1", {}, psycopg.OperationalError(message))


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            wrapped(
                'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
                'FATAL:  database "rig" does not exist'
            ),
            'PostgreSQL has no database "rig" (RIG_DATABASE_URL): `rig-conductor migrate` '
            "creates tables, not databases; create it with `createdb rig` or "
            '`CREATE DATABASE "rig"`, then run `rig-conductor migrate`',
        ),
        (
            wrapped(
                'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
                'FATAL:  password authentication failed for user "rig"'
            ),
            "PostgreSQL refused the credentials in RIG_DATABASE_URL: ",
        ),
        (
            wrapped("connection failed: Connection refused\nIs the server running?"),
            "PostgreSQL unreachable (RIG_DATABASE_URL): OperationalError: ",
        ),
        (OSError("[Errno 113] No route to host"), "PostgreSQL unreachable (RIG_DATABASE_URL): "),
    ],
)
def test_a_postgresql_failure_names_rig_database_url(error: BaseException, says: str) -> None:
    line = pg.describe_failure(error)
    assert line.startswith(says), line
    assert "\n" not in line


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (
            RedisConnectionError("Error 111 connecting to redis:6379. Connection refused."),
            "Redis unreachable (RIG_REDIS_URL): Error 111",
        ),
        (
            AuthenticationError("WRONGPASS invalid username-password pair"),
            "Redis refused the credentials in RIG_REDIS_URL: WRONGPASS",
        ),
    ],
)
def test_a_redis_failure_names_rig_redis_url(error: BaseException, says: str) -> None:
    assert redis_access.describe_failure(error).startswith(says)
