"""What the benchmarks share: their error type and a database of their own to work in."""

from __future__ import annotations

import psycopg
from sqlalchemy.engine import make_url


class BenchError(RuntimeError):
    """A benchmark could not run, or its result failed a check: one line, exit 1."""


def conninfo(url: str, database: str | None = None) -> str:
    """The libpq form of a SQLAlchemy URL (psycopg takes postgresql://...)."""
    target = make_url(url).set(drivername="postgresql")
    if database is not None:
        target = target.set(database=database)
    return target.render_as_string(hide_password=False)


def ensure_database(url: str) -> None:
    """CREATE DATABASE <name> through the server's `postgres` database when it is missing."""
    name = make_url(url).database
    if not name:
        raise BenchError("RIG_BENCH_DATABASE_URL names no database")
    with psycopg.connect(conninfo(url, "postgres"), autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if found is None:
            quoted = name.replace('"', '""')
            conn.execute(f'CREATE DATABASE "{quoted}"'.encode())
