"""Real Redis topologies on local ports, from Debian's redis-server, redis-cli and openssl.

- `Cluster`: 3 primaries and 3 replicas, made with `redis-cli --cluster create`.
- `SentinelSet`: a master, a replica and 3 sentinels watching them.
- `TlsServer`: one server speaking TLS only, with a CA and certificates made here.

Every server runs in the foreground as a child process with its files in a temporary
directory, and is killed when the harness closes. Nothing is persisted (`--save ""`). Every
port is a free one, asked of the kernel: two runs on one machine never collide.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.audit_conftest import unavailable

REDIS_SERVER = "redis-server"
REDIS_CLI = "redis-cli"
START_TIMEOUT_S = 20.0


def require_binaries(*names: str) -> None:
    for name in names:
        if shutil.which(name) is None:
            unavailable(f"{name} is not installed (Debian: redis-server, redis-tools, openssl)")


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1: all held open at once, so none repeats."""
    with ExitStack() as held:
        probes = [held.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def wait_until(check: Any, *, within: float = START_TIMEOUT_S, what: str = "") -> None:
    deadline = time.monotonic() + within
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{what} not ready within {within}s (last error: {last})")


@dataclass
class Server:
    """One redis-server (or sentinel) process."""

    port: int
    directory: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        if not port_free(self.port):
            raise RuntimeError(f"port {self.port} is taken: another test server left running?")
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                self.args, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def kill(self) -> None:
        """SIGKILL: as a crashed host."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log(self) -> str:
        path = self.directory / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""


def redis_args(port: int, *extra: str) -> list[str]:
    return [
        REDIS_SERVER,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]


def client(port: int, **options: Any) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True, socket_timeout=5, **options)


@dataclass
class Cluster:
    """Three primaries, each with one replica, on six free ports (and six more for the bus)."""

    root: Path
    ports: list[int] = field(default_factory=list)
    # Redis's default bus port is the port + 10000, which nothing reserved for us.
    bus_ports: list[int] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.ports:
            ports = free_ports(12)
            self.ports, self.bus_ports = ports[:6], ports[6:]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self) -> Cluster:
        require_binaries(REDIS_SERVER, REDIS_CLI)
        for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
            args = redis_args(
                port,
                "--cluster-port",
                str(bus_port),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--cluster-replica-validity-factor",
                "0",
            )
            self.servers.append(Server(port, self.root / str(port), args).start())
        for port in self.ports:
            wait_until(lambda p=port: client(p).ping(), what=f"cluster node {port}")
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_ok()

        def synced() -> bool:
            replicas = [s.port for s in self.servers if s.port not in self.primaries()]
            return len(replicas) == 3 and all(
                client(p).info("replication").get("master_link_status") == "up" for p in replicas
            )

        wait_until(synced, what="replicas in sync")
        return self

    def wait_ok(self, within: float = 30.0) -> None:
        def settled() -> bool:
            live = [s for s in self.servers if s.process and s.process.poll() is None]
            return all(client(s.port).cluster("info")["cluster_state"] == "ok" for s in live)

        wait_until(settled, within=within, what="cluster state ok")

    def wait_failover(self, dead: int, within: float = 30.0) -> None:
        """Until a replica has taken over every slot the dead primary served."""

        def promoted() -> bool:
            live = self.primaries()
            if len(live) < 3 or dead in live:
                return False
            return all(client(p).cluster("info")["cluster_state"] == "ok" for p in live)

        wait_until(promoted, within=within, what=f"failover of {dead}")

    def primaries(self) -> list[int]:
        """Ports of the current primaries."""
        found = []
        for server in self.servers:
            if server.process is None or server.process.poll() is not None:
                continue
            if client(server.port).info("replication")["role"] == "master":
                found.append(server.port)
        return sorted(found)

    def port_of(self, node_name: str) -> int:
        return int(node_name.rsplit(":", 1)[1])

    def server(self, port: int) -> Server:
        return next(s for s in self.servers if s.port == port)

    def restart(self, port: int) -> None:
        """Bring a killed node back with its own nodes.conf: it rejoins as a replica."""
        old = self.server(port)
        old.process = None
        old.start()
        wait_until(lambda: client(port).ping(), what=f"cluster node {port}")
        self.wait_ok()

    def migrate_slot(self, key: str, to_port: int) -> None:
        """Move the slot of `key`, with every key in it, to the primary on `to_port`, as
        `redis-cli --cluster reshard` does: IMPORTING, MIGRATING, MIGRATE, then SETSLOT NODE."""
        any_node = client(self.primaries()[0])
        slot = int(any_node.execute_command("CLUSTER KEYSLOT", key))
        source = self.owner_of(key)
        if source == to_port:
            raise ValueError(f"{key} is on {to_port} already")
        src, dst = client(source), client(to_port)
        src_id, dst_id = src.execute_command("CLUSTER MYID"), dst.execute_command("CLUSTER MYID")
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
        keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 10_000)
        if keys:
            src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
        for port in self.primaries():
            client(port).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
        self.wait_ok()

    def owner_of(self, key: str) -> int:
        """Port of the primary serving `key`'s slot: the one that answers without MOVED."""
        for port in self.primaries():
            try:
                client(port).type(key)
            except (redis.exceptions.MovedError, redis.exceptions.AskError):
                continue
            return port
        raise LookupError(f"no primary serves {key}")

    def flush(self) -> None:
        for port in self.primaries():
            client(port).flushall()

    def close(self) -> None:
        for server in self.servers:
            server.kill()


@dataclass
class SentinelSet:
    """A master, its replica and three sentinels watching them, each on a free port."""

    root: Path
    master_name: str = "mymaster"
    data_ports: list[int] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)
    servers: list[Server] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.data_ports:
            ports = free_ports(5)
            self.data_ports, self.sentinel_ports = ports[:2], ports[2:]

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self) -> SentinelSet:
        require_binaries(REDIS_SERVER)
        master, replica = self.data_ports
        self.servers.append(Server(master, self.root / str(master), redis_args(master)).start())
        self.servers.append(
            Server(
                replica,
                self.root / str(replica),
                redis_args(replica, "--replicaof", "127.0.0.1", str(master)),
            ).start()
        )
        wait_until(lambda: client(replica).info("replication")["master_link_status"] == "up")
        for port in self.sentinel_ports:
            directory = self.root / str(port)
            directory.mkdir(parents=True, exist_ok=True)
            config = directory / "sentinel.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {self.master_name} 127.0.0.1 {master} 2\n"
                # Three seconds: a CPU-starved master that misses a ping or two on a loaded
                # machine is not failed over for it, which would move the master mid-test.
                f"sentinel down-after-milliseconds {self.master_name} 3000\n"
                f"sentinel failover-timeout {self.master_name} 5000\n"
                f"sentinel parallel-syncs {self.master_name} 1\n"
            )
            args = [REDIS_SERVER, str(config), "--sentinel"]
            self.servers.append(Server(port, directory, args).start())
        for port in self.sentinel_ports:
            wait_until(
                lambda p=port: client(p).execute_command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                ),
                what=f"sentinel {port}",
            )
        return self

    def master_port(self) -> int:
        host_port = client(self.sentinel_ports[0]).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
        )
        return int(host_port[1])

    def server(self, port: int) -> Server:
        return next(s for s in self.servers if s.port == port)

    def restart_as_replica(self, port: int) -> None:
        """Bring a killed data server back as a replica of the current master, and wait until it
        has rejoined the set: a replica in sync, or the master again if the sentinels have
        failed over to it meanwhile (on a loaded machine they may, and that is their right)."""
        old = self.server(port)
        self.servers.remove(old)
        master = self.master_port()
        args = redis_args(port, "--replicaof", "127.0.0.1", str(master))
        self.servers.append(Server(port, old.directory, args).start())

        def rejoined() -> bool:
            replication = client(port).info("replication")
            if replication["role"] == "master":
                return self.master_port() == port
            return replication.get("master_link_status") == "up"

        try:
            wait_until(rejoined, within=60, what=f"data server {port} back in the set")
        except TimeoutError as exc:
            state = client(port).info("replication")
            raise TimeoutError(f"{exc}; its replication: {state}") from None

    def close(self) -> None:
        for server in self.servers:
            server.kill()


@dataclass
class TlsServer:
    """One server on a free port speaking TLS only, with client certificates optional."""

    root: Path
    port: int = field(default_factory=lambda: free_ports(1)[0])
    server: Server | None = None

    @property
    def ca(self) -> Path:
        return self.root / "ca.crt"

    @property
    def client_cert(self) -> Path:
        return self.root / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.root / "client.key"

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def start(self) -> TlsServer:
        require_binaries(REDIS_SERVER, "openssl")
        self.root.mkdir(parents=True, exist_ok=True)
        make_certificates(self.root)
        args = redis_args(
            0,
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.root / "server.crt"),
            "--tls-key-file",
            str(self.root / "server.key"),
            "--tls-ca-cert-file",
            str(self.ca),
            "--tls-auth-clients",
            "optional",
        )
        self.server = Server(self.port, self.root / "data", args).start()
        wait_until(
            lambda: client(self.port, ssl=True, ssl_ca_certs=str(self.ca)).ping(),
            what="TLS server",
        )
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()


def make_certificates(directory: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, signed by the CA."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("genrsa", "-out", "ca.key", "2048")
    openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-days", "2", "-subj", "/CN=rig-test-ca",
        "-out", "ca.crt",
    )  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        openssl("genrsa", "-out", f"{name}.key", "2048")
        openssl("req", "-new", "-key", f"{name}.key", "-subj", f"/CN={name}", "-out", f"{name}.csr")
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", f"{name}.crt",
        )  # fmt: skip
