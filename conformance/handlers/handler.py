"""The conformance handler for the Python runtime: what `conformance/README.md` specifies, in
Python. `rig-conductor agent --handler conformance.handlers.handler:handle`."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rig_conductor.agent import Degraded, Entry, Fenced


class Failed(RuntimeError):
    """The handler's own failure: the entry stays pending."""


def _matches(value: object, consumer: str) -> bool:
    return value == "*" or (isinstance(value, list) and consumer in value)


def handle(entry: Entry) -> None:
    out = Path(os.environ["CONFORMANCE_OUT"])
    issue = entry.fields["issueId"]
    me = f"{issue}.{entry.consumer}"
    (out / "calls").mkdir(parents=True, exist_ok=True)
    (out / "calls" / f"{me}.a{entry.attempt}").touch()
    payload = json.loads(entry.fields.get("payload") or "{}")
    if payload.get("fail"):
        raise Failed(f"{issue} fails on every call")
    if _matches(payload.get("degraded"), entry.consumer):
        until = datetime.now(UTC) + timedelta(seconds=float(payload.get("pauseS", 30)))
        raise Degraded("conformance_degraded", until=until)
    if _matches(payload.get("hold"), entry.consumer):
        (out / "holding").mkdir(parents=True, exist_ok=True)
        (out / "holding" / me).touch()
        while not (out / "release" / issue).exists():
            time.sleep(0.05)
    if "workS" in payload:
        every = float(payload["progressS"])
        for _ in range(round(float(payload["workS"]) / every)):
            time.sleep(every)  # a slice of the work
            try:
                entry.progress()
            except Fenced:
                (out / "fenced").mkdir(parents=True, exist_ok=True)
                (out / "fenced" / f"{me}.a{entry.attempt}").touch()
                raise
    effect = {
        "issueId": issue,
        "entryId": entry.id,
        "consumer": entry.consumer,
        "attempt": entry.attempt,
    }
    entry.stage(out / "effects" / f"{issue}.json").write_text(json.dumps(effect))
