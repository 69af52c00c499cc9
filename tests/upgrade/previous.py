"""The previous release (N-1), installed from this repository's own history into a venv of its
own, and its processes: `migrate`, `serve` and `agent` of either release.

The release is a commit (`RIG_UPGRADE_FROM`, default the 0.1.0 release's): `git archive` of it
is installed with its own constraints.txt into .cache/upgrade/<commit>/venv, once; a later run
reuses it. Its agents run its own tests/e2e/handlers.py, from its own tree.

Waiting on a process (`run`, `Process.stop`) is async and happens in a thread: the test's event
loop also runs the proxy that stands for the Service, and a Service does not stop forwarding
while a migration runs or a replica stops. (A migrate run in the loop once froze the proxy for
8 s on a loaded machine; a request routed just before went out after it, on a keep-alive
connection N-1 had meanwhile closed as idle, and came back a 502.)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests import needs

REPO = Path(__file__).resolve().parents[2]
PREVIOUS = os.environ.get("RIG_UPGRADE_FROM", "63a7d06")
STOP_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class Release:
    """Where a release's code runs from: its interpreter, and the tree its test handlers are in."""

    name: str
    python: Path
    tree: Path

    def command(self, *args: str) -> list[str]:
        return [str(self.python), "-m", "rig_conductor", *args]


CURRENT = Release("current", Path(sys.executable), REPO)


def previous_release() -> Release:
    root = REPO / ".cache" / "upgrade" / PREVIOUS
    tree, venv = root / "src", root / "venv"
    stamp = venv / ".installed"
    if not stamp.exists():
        archive = subprocess.run(
            ["git", "archive", "--format=tar", PREVIOUS], capture_output=True, cwd=REPO, check=False
        )
        if archive.returncode != 0:
            needs.missing(f"the previous release {PREVIOUS} is not in this clone's history")
        tree.mkdir(parents=True, exist_ok=True)
        archive_file = root / "release.tar"
        archive_file.write_bytes(archive.stdout)
        with tarfile.open(archive_file) as tar:
            tar.extractall(tree, filter="data")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
             "-c", str(tree / "constraints.txt"), str(tree)],
            check=True, timeout=900,
        )  # fmt: skip
        stamp.touch()
    return Release(PREVIOUS, venv / "bin" / "python", tree)


def environment(release: Release, **env: str) -> dict[str, str]:
    """The process environment: no RIG_* of the test's own, the release's tree importable."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    base.pop("PYTHONPATH", None)
    return base | {"PYTHONPATH": str(release.tree), "PYTHONFAULTHANDLER": "1"} | env


@dataclass
class Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def stop(self) -> int:
        """SIGTERM, and the exit code; killed if it does not stop in time."""
        return await asyncio.to_thread(self._stop)

    def _stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode


def start(release: Release, name: str, args: list[str], logs: Path, **env: str) -> Process:
    log = logs / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            release.command(*args),
            cwd=logs,
            env=environment(release, **env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return Process(name, process, log)


async def run(release: Release, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """A command of a release to its end, waited for in a thread."""
    return await asyncio.to_thread(
        subprocess.run, release.command(*args), env=environment(release, **env),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
