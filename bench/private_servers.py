"""Servers of a bench's own, which it may stop and start: a PostgreSQL cluster (initdb, pg_ctl)
and a redis-server without persistence, each on a free port with its files in a temporary
directory. It touches no other server on the machine: every process it stops is one it started.
The Redis may keep its ACL users in an aclfile (`ACL SAVE` writes it), which a restart reads
again, as an operator's Redis does: data is lost with the restart, users are not.

PostgreSQL runs as the `postgres` user when the bench runs as root (initdb refuses root), with
its files under the system's temporary directory, where that user can reach them. Debian keeps
initdb and pg_ctl in /usr/lib/postgresql/<version>/bin, off PATH: they are looked for there too.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

SERVER_USER = "postgres"
START_TIMEOUT_S = 60.0


class ServerError(RuntimeError):
    """A server could not be found, started or stopped: one line for the operator."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _binary(name: str, pattern: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(pattern), reverse=True)), None)
    if found is None:
        raise ServerError(f"{name} is not installed (Debian: postgresql, redis-server)")
    return found


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *command] if os.geteuid() == 0 else command


def _wait(check: Callable[[], object], what: str, within: float = START_TIMEOUT_S) -> None:
    """Until `check()` answers without raising, `within` seconds at most."""
    deadline, last = time.monotonic() + within, None
    while time.monotonic() < deadline:
        try:
            check()
            return
        except Exception as exc:  # not up yet
            last = exc
            time.sleep(0.1)
    raise ServerError(f"{what} did not answer within {within:.0f}s: {last}")


@dataclass
class PrivatePostgres:
    """One PostgreSQL cluster on 127.0.0.1; the port is picked at the first start and kept."""

    directory: Path
    port: int = 0

    def __post_init__(self) -> None:
        self.initdb = _binary("initdb", "/usr/lib/postgresql/*/bin/initdb")
        self.pg_ctl = _binary("pg_ctl", "/usr/lib/postgresql/*/bin/pg_ctl")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _pg_ctl(self, *args: str) -> None:
        command = [self.pg_ctl, "-D", str(self.directory / "data"), *args]
        done = subprocess.run(
            _as_server_user(command),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S + 30,
            check=False,
        )
        if done.returncode != 0:
            raise ServerError(f"pg_ctl {args[-1]} exited {done.returncode}: {done.stderr[-500:]}")

    def init(self) -> None:
        command = [self.initdb, "-D", str(self.directory / "data"), "-U", "postgres"]
        command += ["-A", "trust", "-N"]
        done = subprocess.run(
            _as_server_user(command), capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise ServerError(f"initdb exited {done.returncode}: {done.stderr[-500:]}")

    def start(self) -> None:
        """Start, on the port it had (a free one the first time)."""
        self.port = self.port or free_port()
        options = (
            f"-p {self.port} -h 127.0.0.1 -k {self.directory} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        log = str(self.directory / "server.log")
        self._pg_ctl("-o", options, "-l", log, "-w", "-t", str(int(START_TIMEOUT_S)), "start")
        _wait(self._answer, f"PostgreSQL on port {self.port}")

    def _answer(self) -> None:
        with psycopg.connect(self.conninfo(), connect_timeout=2) as conn:
            conn.execute("SELECT 1")

    def stop(self, mode: str = "fast") -> None:
        """`fast` cuts every session, as an operator's restart or a failover does."""
        self._pg_ctl("-m", mode, "-w", "-t", str(int(START_TIMEOUT_S)), "stop")

    def running(self) -> bool:
        command = [self.pg_ctl, "-D", str(self.directory / "data"), "status"]
        return subprocess.run(_as_server_user(command), capture_output=True).returncode == 0

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.conninfo(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.url(name)


def redis_server_version() -> tuple[int, ...]:
    """The version of the redis-server `PrivateRedis` runs (`redis-server --version`)."""
    binary = _binary("redis-server", "/usr/bin/redis-server")
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"\bv=(\d+(?:\.\d+)*)", done.stdout)
    if found is None:
        raise ServerError(f"{binary} --version said {done.stdout.strip()!r}: no version in it")
    return tuple(int(part) for part in found.group(1).split("."))


@dataclass
class PrivateRedis:
    """One redis-server on 127.0.0.1 without persistence: a restart starts it empty. With
    `aclfile`, its users live in `acl_path` (`ACL SAVE`), loaded again at every start."""

    directory: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    aclfile: bool = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    @property
    def acl_path(self) -> Path:
        return self.directory / "users.acl"

    def start(self) -> None:
        self.port = self.port or free_port()
        command = [_binary("redis-server", "/usr/bin/redis-server"), "--port", str(self.port)]
        command += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        command += ["--daemonize", "no", "--dir", str(self.directory)]
        if self.aclfile:
            self.acl_path.touch()  # Redis refuses to start on a missing aclfile; empty is fine
            command += ["--aclfile", str(self.acl_path)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the bench, which stops it last
            )
        _wait(self._answer, f"redis-server on port {self.port}")

    def _answer(self) -> None:
        if self.process is None or self.process.poll() is not None:
            raise ServerError(f"redis-server exited; see {self.log}")
        with redis.Redis(port=self.port, socket_timeout=2) as client:
            client.ping()

    def restart_empty(self) -> None:
        """SHUTDOWN NOSAVE, then a new server on the same port: nothing survives."""
        with (
            contextlib.suppress(RedisConnectionError),
            redis.Redis(port=self.port, socket_timeout=5) as client,
        ):
            client.shutdown(nosave=True)
        self.stop()
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def server_directory(prefix: str) -> Iterator[Path]:
    """A directory under the system's temporary directory that the server user owns."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(path, user.pw_uid, user.pw_gid)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """initdb and start; stopped (immediate) and removed afterwards, whatever happened."""
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise ServerError(f"running as root with no `{SERVER_USER}` user") from None
    with server_directory("rig-bench-pg-") as directory:
        server = PrivatePostgres(directory)
        server.init()
        try:
            server.start()
            yield server
        finally:
            if server.running():
                with contextlib.suppress(ServerError, subprocess.TimeoutExpired):
                    server.stop("immediate")


@contextlib.contextmanager
def private_redis(*, aclfile: bool = False) -> Iterator[PrivateRedis]:
    with tempfile.TemporaryDirectory(prefix="rig-bench-redis-") as directory:
        server = PrivateRedis(Path(directory), aclfile=aclfile)
        try:
            server.start()
            yield server
        finally:
            server.stop()
