"""A private PostgreSQL (initdb + pg_ctl) and Debian's PgBouncer in front of it, for tests that
stop and start the database for real.

Both run as the `postgres` user when the tests run as root (initdb and PgBouncer refuse root),
with their files in a directory of their own under /tmp: not under pytest's temporary root,
which pytest makes private to root again at the start of every session, cutting the `postgres`
user off from its files. Every port is a free one asked of the kernel.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.needs import missing

START_TIMEOUT_S = 60
SERVER_USER = "postgres"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1: all held open at once, so none repeats."""
    with ExitStack() as held:
        probes = [held.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def _binary(name: str, *fallbacks: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted((p for pattern in fallbacks for p in glob.glob(pattern)), reverse=True)
    return candidates[0] if candidates else None


@dataclass(frozen=True)
class Binaries:
    initdb: str
    pg_ctl: str
    pgbouncer: str


def binaries() -> Binaries:
    """initdb, pg_ctl and pgbouncer, or a skip (a failure when CI is set) naming what is missing."""
    initdb = _binary("initdb", "/usr/lib/postgresql/*/bin/initdb")
    pg_ctl = _binary("pg_ctl", "/usr/lib/postgresql/*/bin/pg_ctl")
    pgbouncer = _binary("pgbouncer", "/usr/sbin/pgbouncer")
    if initdb is None or pg_ctl is None:
        missing("initdb / pg_ctl not installed (Debian: postgresql)")
    if pgbouncer is None:
        missing("pgbouncer not installed (Debian: pgbouncer)")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            missing(f"running as root, and there is no `{SERVER_USER}` user to run the servers as")
    return Binaries(initdb, pg_ctl, pgbouncer)


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], *, timeout: float = START_TIMEOUT_S) -> None:
    done = subprocess.run(
        _as_server_user(command), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")


@contextmanager
def server_directory(prefix: str) -> Iterator[Path]:
    """A directory under /tmp that the server user owns; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def wait_until_answers(conninfo: str, *, within: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(conninfo, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
                return
        except psycopg.Error as exc:
            last = exc
            time.sleep(0.1)
    raise TimeoutError(f"{conninfo} did not answer within {within}s: {last}")


@dataclass
class PrivatePostgres:
    """One PostgreSQL cluster of the test's own, on 127.0.0.1 and a free port."""

    bins: Binaries
    directory: Path
    port: int = 0
    # Once clients know the port, a start keeps it.
    keep_port: bool = field(default=False)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> None:
        _run([self.bins.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-N"])

    def start(self) -> None:
        """Start (again) on its port; the first start picks one, trying another if it is taken
        between the probe and the bind."""
        for attempt in range(3):
            if not self.keep_port:
                self.port = free_ports(1)[0]
            options = (
                f"-p {self.port} -h 127.0.0.1 -k {self.directory} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                log = str(self.directory / "server.log")
                _run([self.bins.pg_ctl, "-D", str(self.data), "-o", options, "-l", log, "start"])
            except RuntimeError:
                if attempt == 2 or self.keep_port:
                    raise
                continue
            wait_until_answers(self.conninfo())
            self.keep_port = True
            return

    def stop(self) -> None:
        """A fast shutdown (what an operator or a failover does): sessions are cut."""
        _run([self.bins.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"])

    def running(self) -> bool:
        status = subprocess.run(
            _as_server_user([self.bins.pg_ctl, "-D", str(self.data), "status"]),
            capture_output=True,
            check=False,
        )
        return status.returncode == 0

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.conninfo(), autocommit=True, prepare_threshold=None) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextmanager
def private_postgres(bins: Binaries) -> Iterator[PrivatePostgres]:
    """initdb, start; stopped (immediate) and removed afterwards, whatever the test did."""
    with server_directory("rig-pg-") as directory:
        server = PrivatePostgres(bins, directory)
        server.init()
        try:
            server.start()
            yield server
        finally:
            if server.running():
                with contextlib.suppress(Exception):
                    _run([bins.pg_ctl, "-D", str(server.data), "-m", "immediate", "-w", "stop"])


@dataclass
class PgBouncer:
    """Debian's PgBouncer in transaction pooling mode, every database of `upstream` behind it."""

    process: subprocess.Popen[bytes]
    port: int
    directory: Path

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text(errors="replace")


_CONFIG = """\
[databases]
* = host=127.0.0.1 port={upstream}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/users.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
; Hand out server connections in turn, not the one used last: a statement prepared on one
; server connection is then soon run on another, so one would fail at once.
server_round_robin = 1
; While PostgreSQL cannot be reached: retry its login every second, and answer a waiting
; client with an error after 5 s instead of 120.
server_login_retry = 1
query_wait_timeout = 5
pidfile = {directory}/pgbouncer.pid
"""


@contextmanager
def pgbouncer(bins: Binaries, upstream: PrivatePostgres) -> Iterator[PgBouncer]:
    """Started in the foreground as the server user; SIGTERM (then SIGKILL) afterwards."""
    with server_directory("rig-pgbouncer-") as directory:
        port = free_ports(1)[0]
        (directory / "users.txt").write_text('"postgres" ""\n')
        config = directory / "pgbouncer.ini"
        config.write_text(_CONFIG.format(upstream=upstream.port, port=port, directory=directory))
        for path in (config, directory / "users.txt"):
            path.chmod(0o644)
        with (directory / "pgbouncer.log").open("wb") as log:
            process = subprocess.Popen(
                _as_server_user([bins.pgbouncer, str(config)]),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: runuser and PgBouncer
            )
        bouncer = PgBouncer(process, port, directory)
        try:
            wait_until_answers(f"postgresql://postgres@127.0.0.1:{port}/postgres", within=20)
            yield bouncer
        finally:
            _stop_group(process)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group this harness started (PgBouncer shuts down at once), SIGKILL if it
    lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # whatever of the group is left
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
