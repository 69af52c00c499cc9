"""A real Spark standalone cluster from the pyspark wheel: a master on 127.0.0.1 and workers of
one core each, started with the wheel's bin/spark-class. Every process runs in a session of its
own, so a worker is killed with the executors it launched, as when its host dies."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class SparkCluster:
    root: Path
    workers: int = 2
    worker_memory: str = "1g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}

    def _spawn(self, name: str, *args: str) -> None:
        log = self.root / f"{name}.log"
        with log.open("ab") as sink:
            self.processes[name] = subprocess.Popen(
                [str(spark_class()), *args],
                env=self._env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(self) -> SparkCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for n in range(self.workers):
            self.start_worker(n)
        self.wait_for_workers(self.workers)
        return self

    def start_worker(self, n: int) -> None:
        work = self.root / f"worker-{n}"
        work.mkdir(parents=True, exist_ok=True)
        self._spawn(
            f"worker-{n}",
            "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", "1", "--memory", self.worker_memory,
            "--webui-port", str(free_port()), "--work-dir", str(work), self.url,
        )  # fmt: skip

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as reply:
            found: dict[str, Any] = json.loads(reply.read())
            return found

    def alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.state()["workers"])
        except (OSError, ValueError):
            # Not up yet. While the master's web UI starts, /json can be answered by the
            # status page (HTML) before its own handler is attached.
            return 0

    def wait_for_workers(self, count: int, within: float = 90) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.alive_workers() >= count:
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in self.root.glob("*.log")}
        raise TimeoutError(f"{count} Spark workers not registered within {within}s: {logs}")

    def kill_worker(self, n: int) -> None:
        """SIGKILL the worker and the executors it launched (its whole process session)."""
        process = self.processes.pop(f"worker-{n}")
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop(self) -> None:
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        self.processes.clear()
