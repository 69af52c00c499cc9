"""Engines and the schema check. Knows connection handling, nothing about the rows."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def create_engine(url: str, *, pool_size: int = 10) -> AsyncEngine:
    """An async engine on psycopg 3. `pool_pre_ping` survives a database restart."""
    return create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)
