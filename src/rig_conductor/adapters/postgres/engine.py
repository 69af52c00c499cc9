"""Engines and the schema check. Knows connection handling, nothing about the rows.

The check compares the database's applied revision with `SCHEMA_HEAD` and never loads alembic:
every command that needs the schema runs it at start, and alembic is only needed to migrate.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

# The newest revision in migrations/versions: what this release needs. A test checks that
# alembic's head is this revision, so a new migration cannot ship without it.
SCHEMA_HEAD = "0013"


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine on psycopg 3. `pool_pre_ping` survives a database restart."""
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


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
        text_ = str(exc).strip()
        first = text_.splitlines()[0] if text_ else ""
        return f"PostgreSQL unreachable: {type(exc).__name__}: {first}"
    if current != SCHEMA_HEAD:
        return (
            f"Database schema is at revision {current or 'none'}, this release needs "
            f"{SCHEMA_HEAD}: run `rig-conductor migrate`"
        )
    return None
