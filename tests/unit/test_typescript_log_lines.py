"""The TypeScript runtime's log-line table (`clients/typescript/test/log-lines.json`, which its
`npm test` checks the TypeScript logger against) says what `rig_conductor.logs` writes: the two
runtimes' text and JSON lines read alike, field names, order, escapes and all."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rig_conductor.logs import JsonFormatter, TextFormatter

TABLE = json.loads(
    (Path(__file__).resolve().parents[2] / "clients/typescript/test/log-lines.json").read_text()
)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The text format writes local time; the table was made, and is read, in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def record(case: dict[str, Any]) -> logging.LogRecord:
    made = logging.LogRecord(
        "rig-agent", getattr(logging, case["level"]), __file__, 1, case["message"], None, None
    )
    made.created = case["timeMs"] / 1000
    made.msecs = case["timeMs"] % 1000
    for name, value in case["fields"].items():
        setattr(made, name, value)
    return made


@pytest.mark.parametrize("case", TABLE["lines"], ids=lambda c: c["message"][:30])
def test_json_line(case: dict[str, Any]) -> None:
    assert JsonFormatter().format(record(case)) == case["json"]


@pytest.mark.parametrize("case", TABLE["lines"], ids=lambda c: c["message"][:30])
def test_text_line(case: dict[str, Any]) -> None:
    assert TextFormatter().format(record(case)) == case["text"]
