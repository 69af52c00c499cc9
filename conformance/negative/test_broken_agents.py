"""The suite's own negative tests: every scenario fails against an agent that breaks the rule it
checks (`conformance/broken/agent.py`). A scenario that passed against its broken agent would
check nothing.

Each broken agent runs its scenario in a pytest of its own, on the same servers (embedded ones
unless RIG_TEST_REDIS_URL / RIG_TEST_DATABASE_URL name others)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.broken.agent import FLAWS

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
REPO = SCENARIOS.parents[1]


def test_every_scenario_has_a_broken_agent() -> None:
    scenarios = {
        f"{path.name}::{name}" for path in SCENARIOS.glob("test_*.py") for name in _test_names(path)
    }
    assert scenarios == {scenario for _, scenario, _ in FLAWS.values()}


def _test_names(path: Path) -> list[str]:
    return [
        line.split("(")[0].removeprefix("async def ").removeprefix("def ")
        for line in path.read_text().splitlines()
        if line.startswith(("async def test_", "def test_"))
    ]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("flaw", sorted(FLAWS))
def test_the_scenario_fails_against_the_broken_agent(flaw: str) -> None:
    broken, scenario, _ = FLAWS[flaw]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(SCENARIOS / scenario),
            f"--agent=broken:{flaw}",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rf",
        ],
        cwd=REPO,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=380,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 1 and "1 failed" in summary and "error" not in summary, (
        f"an agent that {broken} passed (or could not run) {scenario}: exit {done.returncode}\n"
        f"{done.stdout[-4000:]}{done.stderr[-2000:]}"
    )
