"""When `rig-conductor demo` exits: a person at a terminal keeps a live console until Ctrl-C;
a script (stdout not a terminal) gets the story and exit 0, as the contract has always said."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import httpx
import pytest

from .test_cli import run

pytestmark = pytest.mark.timeout(240)


def test_without_a_terminal_the_demo_exits_after_the_story() -> None:
    done = run("demo", "--timeout", "60", env={}, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1].startswith("Demo done: 6 of 6 issues completed")
    assert "stdout is not a terminal: the demo exits after the story" in done.stderr


def read_until(fd: int, pattern: str, seen: bytearray, within: float) -> re.Match[str]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if found := re.search(pattern, seen.decode(errors="replace")):
            return found
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen.extend(os.read(fd, 65536))
            except OSError:  # the other end closed
                break
    raise AssertionError(f"no {pattern!r} within {within} s in: {seen.decode(errors='replace')}")


def wait_for_dispatches(url: str, more_than: int, within: float = 30) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        found = re.search(r"^rig_dispatched_entries_total\{[^}]*\} (\S+)$", metrics, re.M)
        if found and float(found[1]) > more_than:
            return
        time.sleep(0.2)
    raise AssertionError(f"no more than {more_than} dispatches within {within} s")


def test_at_a_terminal_the_demo_keeps_a_live_fleet_until_ctrl_c() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    terminal, process_side = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rig_conductor", "demo", "--timeout", "60"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=process_side,
        stderr=subprocess.DEVNULL,
    )
    os.close(process_side)
    seen = bytearray()
    try:
        console = read_until(terminal, r"Console: (http://\S+)/ui", seen, within=150)
        read_until(terminal, r"Demo done: 6 of 6 issues completed", seen, within=150)
        # The story is told, and the demo goes on: new issues are dispatched and built.
        wait_for_dispatches(console[1], more_than=6)
        assert process.poll() is None, "the demo exited at a terminal"
        process.send_signal(signal.SIGINT)
        stopped = read_until(
            terminal, r"Demo stopped: (\d+) of (\d+) issues completed; 3 reclaimed", seen, 60
        )
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(terminal)
    assert int(stopped[2]) > 6
