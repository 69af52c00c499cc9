"""The TypeScript runtime's staging-name table (`clients/typescript/test/staged-names.json`,
which its `npm test` checks the TypeScript code against) says what `domain` says: the two
runtimes and the conductor name and check staged files alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rig_conductor import domain

TABLE = json.loads(
    (Path(__file__).resolve().parents[2] / "clients/typescript/test/staged-names.json").read_text()
)


@pytest.mark.parametrize("case", TABLE["stagedPath"], ids=lambda c: c["path"][:40])
def test_staged_path(case: dict[str, object]) -> None:
    path, entry_id, attempt = str(case["path"]), str(case["entryId"]), int(str(case["attempt"]))
    assert domain.staged_path(path, entry_id=entry_id, attempt=attempt) == case["staged"]


@pytest.mark.parametrize("case", TABLE["stagedOutput"], ids=lambda c: c["staged"][:40])
def test_staged_output(case: dict[str, object]) -> None:
    try:
        domain.staged_output(
            str(case["staged"]), str(case["path"]), attempt=int(str(case["attempt"]))
        )
    except ValueError:
        valid = False
    else:
        valid = True
    assert valid is case["valid"]
