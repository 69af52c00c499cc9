"""The chaos soak's two handlers do the same (bench/chaos.py `handle` for Python agents,
bench/chaos_handler.mjs for TypeScript ones), so a mixed fleet's effects cannot tell the
runtimes apart: one staged file of the same name and content, the same poison failure, the same
Degraded pause. The Node side imports `Degraded` from the built package (`rig_agent` builds it).

Off CI a machine without Node skips; with CI set, that fails (`tests.needs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rig_conductor.agent import Degraded

from .ts_agent import WITHIN, rig_agent_fixture  # noqa: F401 - the `rig_agent` fixture

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from chaos import handle  # noqa: E402 - bench/ is not a package

ISSUE = "chaos-run1-00007"
ENTRY = "1700000000000-3"
# Runs the Node handler on one entry; prints what it staged, or what it threw.
DRIVER = """
import { writeFileSync } from "node:fs";
const { handle } = await import(process.argv[1]);
const [fields, id, attempt] = JSON.parse(process.argv[2]);
const staged = [];
const stage = (path) => { staged.push(path); return `${path}.staged`; };
const entry = { id, attempt, fields, stage };
try {
  await handle(entry);
  console.log(JSON.stringify({ staged }));
} catch (error) {
  const until = error.until ? error.until.getTime() / 1000 : null;
  console.log(JSON.stringify({ error: error.constructor.name, message: error.message, until }));
}
"""


@dataclass
class FakeEntry:
    """What `handle` uses of a Python runtime's entry; `stage` writes beside the path."""

    fields: dict[str, str]
    id: str = ENTRY
    attempt: int = 2
    staged: list[Path] = field(default_factory=list)

    def stage(self, path: Path) -> Path:
        self.staged.append(Path(path))
        return Path(f"{path}.staged")


def run_node(rig_agent: list[str], fields: dict[str, str], **env: str) -> dict[str, object]:
    """The Node handler on one entry, in this process's environment plus `env`."""
    done = subprocess.run(
        [
            rig_agent[0],
            "--input-type=module",
            "-e",
            DRIVER,
            str(BENCH / "chaos_handler.mjs"),
            json.dumps([fields, ENTRY, 2]),
        ],
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=WITHIN,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_both_stage_one_file_of_the_same_name_and_content(
    rig_agent: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dirs = python_out, node_out = tmp_path / "py", tmp_path / "node"
    for directory in dirs:
        directory.mkdir()
    fields = {"issueId": ISSUE, "payload": json.dumps({"title": "Build it", "poison": False})}
    monkeypatch.setenv("CHAOS_OUT_DIR", str(python_out))
    entry = FakeEntry(fields)
    handle(entry)
    node = run_node(rig_agent, fields, CHAOS_OUT_DIR=str(node_out))

    name = f"{ISSUE}--{ENTRY}.a2.json"
    assert entry.staged == [python_out / name]
    assert node == {"staged": [str(node_out / name)]}
    python, node_effect = (json.loads(Path(f"{d / name}.staged").read_text()) for d in dirs)
    assert python == node_effect == {"issueId": ISSUE, "entryId": ENTRY, "attempt": 2}


def test_both_fail_a_poison_issue_alike(
    rig_agent: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {"issueId": ISSUE, "payload": json.dumps({"poison": True})}
    monkeypatch.setenv("CHAOS_OUT_DIR", str(tmp_path))
    with pytest.raises(RuntimeError) as raised:
        handle(FakeEntry(fields))
    node = run_node(rig_agent, fields)
    assert node == {"error": "Error", "message": str(raised.value), "until": None}
    assert str(raised.value) == f"{ISSUE} is poison: its build fails every time"
    assert list(tmp_path.iterdir()) == []


def test_both_pause_six_seconds_when_degraded(
    rig_agent: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fields = {"issueId": ISSUE, "payload": "{}"}
    monkeypatch.setenv("CHAOS_OUT_DIR", str(tmp_path))
    monkeypatch.setenv("CHAOS_DEGRADED", "1")
    before = datetime.now(UTC)
    with pytest.raises(Degraded) as raised:
        handle(FakeEntry(fields))
    node = run_node(rig_agent, fields)
    after = datetime.now(UTC)

    assert raised.value.reason == "chaos_quota_exhausted"
    assert node["error"] == "Degraded" and node["message"] == "chaos_quota_exhausted"
    pause = timedelta(seconds=6)
    assert raised.value.until is not None
    assert before + pause <= raised.value.until <= after + pause
    node_until = datetime.fromtimestamp(float(str(node["until"])), UTC)
    assert before + pause - timedelta(milliseconds=1) <= node_until <= after + pause
