"""Handlers the end-to-end tests run inside real `rig-conductor agent` processes.

Configured through the environment of the agent process:

- `E2E_OUT_DIR` (required): effects go to `effects/<issueId>.json`, staged with `entry.stage`,
  so a file appears only once the conductor has accepted the attempt's completion. Every call
  also leaves a marker `calls/<issueId>.<consumer>.a<attempt>` before doing anything else.
- `E2E_WORK_S` (default 0.05): the work, a sleep.
- `E2E_FAIL_FIRST` (default 0): the first N calls in this process raise (a flaky worker).
- `E2E_HOLD_FILE`: once the failures are spent, a call blocks while this file exists and
  writes `holding-<consumer>` first (a worker stuck in a long build, about to be killed).

An issue dispatched with payload `{"poison": true}` fails on every call.

`review` is seed 001's codex worker: while `E2E_DEGRADED_CALLS` (default 0) calls are not
spent, it raises `Degraded("codex_quota_exhausted_until_<iso>")` with a pause of
`E2E_DEGRADED_PAUSE_S`; after that it builds like `build`.

`hang` blocks on the issues named in `E2E_HANG_ISSUES` (comma list) while `E2E_HANG_FILE`
exists, without reporting progress (a deadlocked CLI); other issues build like `build`.
`hang_async` does the same in an `async def` handler, until it is cancelled.

Importing this module makes SIGUSR1 print the stack of every asyncio task of the agent to its
log: the fleet asks for it from an agent that does not stop in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rig_conductor.agent import Degraded, Entry


def _print_tasks(signum: int, frame: object) -> None:
    loop = asyncio._get_running_loop()  # the signal arrives in the loop's (main) thread
    if loop is None:
        print("SIGUSR1: no running event loop", file=sys.stderr, flush=True)
        return
    for task in asyncio.all_tasks(loop):
        print(f"SIGUSR1: task {task.get_name()}:", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


signal.signal(signal.SIGUSR1, _print_tasks)

_lock = threading.Lock()
_calls = 0


class BuildFailed(RuntimeError):
    pass


def build(entry: Entry) -> None:
    out = Path(os.environ["E2E_OUT_DIR"])
    issue = entry.fields["issueId"]
    marker = out / "calls" / f"{issue}.{entry.consumer}.a{entry.attempt}"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if json.loads(entry.fields.get("payload") or "{}").get("poison"):
        raise BuildFailed(f"{issue} is poison: its build fails every time")
    if _next_call() <= int(os.environ.get("E2E_FAIL_FIRST", "0")):
        raise BuildFailed(f"{issue}: flaky worker {entry.consumer} failed the build")
    hold = os.environ.get("E2E_HOLD_FILE")
    if hold and os.path.exists(hold):
        (out / f"holding-{entry.consumer}").write_text(entry.id)
        while os.path.exists(hold):
            time.sleep(0.05)
    time.sleep(float(os.environ.get("E2E_WORK_S", "0.05")))  # the build's work
    effect = {
        "issueId": issue,
        "entryId": entry.id,
        "consumer": entry.consumer,
        "attempt": entry.attempt,
    }
    entry.stage(out / "effects" / f"{issue}.json").write_text(json.dumps(effect))


def _next_call() -> int:
    global _calls
    with _lock:
        _calls += 1
        return _calls


def review(entry: Entry) -> None:
    if _next_call() <= int(os.environ.get("E2E_DEGRADED_CALLS", "0")):
        until = datetime.now(UTC) + timedelta(seconds=float(os.environ["E2E_DEGRADED_PAUSE_S"]))
        raise Degraded(f"codex_quota_exhausted_until_{until.isoformat()}", until=until)
    build(entry)


def hang(entry: Entry) -> None:
    if entry.fields["issueId"] in os.environ.get("E2E_HANG_ISSUES", "").split(","):
        _mark_hanging(entry)
        hold = os.environ["E2E_HANG_FILE"]
        while os.path.exists(hold):
            time.sleep(0.05)
    build(entry)


async def hang_async(entry: Entry) -> None:
    """`hang` as an `async def` handler: blocks on the loop until cancelled."""
    if entry.fields["issueId"] in os.environ.get("E2E_HANG_ISSUES", "").split(","):
        await asyncio.to_thread(_mark_hanging, entry)
        out = Path(os.environ["E2E_OUT_DIR"])
        try:
            await asyncio.Event().wait()  # nothing ever sets it: a deadlock
        except asyncio.CancelledError:
            (out / f"cancelled-{entry.consumer}").write_text(entry.id)
            raise
    await asyncio.to_thread(build, entry)


def _mark_hanging(entry: Entry) -> None:
    out = Path(os.environ["E2E_OUT_DIR"])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"hanging-{entry.consumer}").write_text(entry.id)


def slow(entry: Entry) -> None:
    """Works at least `E2E_SLOW_S` on the issues in `E2E_SLOW_ISSUES`, reporting progress after
    each `E2E_PROGRESS_S` (`E2E_SLOW_S / E2E_PROGRESS_S` reports, however long each takes), then
    builds: long work that keeps its entry past the deadline."""
    if entry.fields["issueId"] in os.environ.get("E2E_SLOW_ISSUES", "").split(","):
        every = float(os.environ["E2E_PROGRESS_S"])
        for _ in range(round(float(os.environ["E2E_SLOW_S"]) / every)):
            time.sleep(every)  # a slice of the work
            entry.progress()
    build(entry)
