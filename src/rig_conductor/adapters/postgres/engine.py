"""Engines and the schema check. Knows connection handling, nothing about the rows.

The check compares the database's applied revision with `SCHEMA_HEAD` and never loads alembic:
every command that needs the schema runs it at start, and alembic is only needed to migrate.

RIG_DATABASE_URL may point at PgBouncer in transaction pooling mode, which hands each
transaction to whichever server connection is free. A statement psycopg prepared on one server
connection is unknown on the next (PgBouncer 1.18 does not track them), so no connection the
conductor makes ever prepares one: every engine here, and every direct psycopg connection,
passes `NO_PREPARE`.
"""

from __future__ import annotations

import re
from typing import Any, TypeAlias

import sqlalchemy
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

# The database as the layers above the adapters name it, without importing its driver.
Engine: TypeAlias = AsyncEngine

# The newest revision in migrations/versions: what this release needs. A test checks that
# alembic's head is this revision, so a new migration cannot ship without it.
SCHEMA_HEAD = "0020"

# psycopg's connect() keywords: never prepare a statement on the server (psycopg's default
# prepares any statement run 5 times on one connection).
NO_PREPARE: dict[str, Any] = {"prepare_threshold": None}


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine on psycopg 3. `pool_pre_ping` checks a pooled connection before handing
    it out, so one left stale by a database restart is replaced, never used."""
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args=dict(NO_PREPARE),
    )


def create_unpooled_engine(url: str) -> AsyncEngine:
    """An async engine that opens a connection per use: for a one-off check."""
    return create_async_engine(url, poolclass=NullPool, connect_args=dict(NO_PREPARE))


def create_sync_engine(url: str) -> sqlalchemy.Engine:
    """A blocking engine, a connection per use: for migrations and the audit's one write."""
    return sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=dict(NO_PREPARE))


async def applied_revision(engine: AsyncEngine) -> str | None:
    """The schema revision the database is at; None when it was never migrated (no
    alembic_version table). Raises what the connection raises when PostgreSQL is down."""
    try:
        async with engine.connect() as conn:
            found = (await conn.execute(text("SELECT version_num FROM alembic_version"))).scalar()
    except ProgrammingError:
        return None
    return str(found) if found is not None else None


async def schema_problem(engine: AsyncEngine) -> str | None:
    """None when PostgreSQL answers and its schema is at `SCHEMA_HEAD`; else what is wrong,
    in one line."""
    try:
        current = await applied_revision(engine)
    except Exception as exc:
        return describe_failure(exc)
    if current != SCHEMA_HEAD:
        return (
            f"Database schema is at revision {current or 'none'}, this release needs "
            f"{SCHEMA_HEAD}: run `rig-conductor migrate` (against RIG_DATABASE_URL)"
        )
    return None


_NO_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')
_BAD_CREDENTIALS = ("password authentication failed", "no password supplied", 'role "')


def describe_failure(exc: BaseException) -> str:
    """One line for an operator: what failed in reaching PostgreSQL, naming RIG_DATABASE_URL,
    and how to fix it where that is known (a missing database: migrate creates tables, not
    databases)."""
    text_ = str(exc).strip()
    first = text_.splitlines()[0] if text_ else type(exc).__name__
    first = first.removeprefix("(psycopg.OperationalError) ")
    if (missing := _NO_DATABASE.search(first)) is not None:
        name = missing["name"]
        return (
            f'PostgreSQL has no database "{name}" (RIG_DATABASE_URL): `rig-conductor migrate` '
            f"creates tables, not databases; create it with `createdb {name}` or "
            f'`CREATE DATABASE "{name}"`, then run `rig-conductor migrate`'
        )
    if any(sign in first for sign in _BAD_CREDENTIALS):
        return f"PostgreSQL refused the credentials in RIG_DATABASE_URL: {first}"
    return f"PostgreSQL unreachable (RIG_DATABASE_URL): {type(exc).__name__}: {first}"
