"""--handler resolution: `pkg.module:func`, plain or async; one clear line for anything else."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from rig_conductor.agent.cli import HandlerError, load_handler

MODULE = """
import asyncio

def plain(entry):
    return None

async def coro(entry):
    await asyncio.sleep(0)  # a coroutine that really awaits

class Jobs:
    @staticmethod
    def build(entry):
        return None

NOT_CALLABLE = 42
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"agent_handlers_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.chdir(tmp_path)  # handlers in the working directory import, as with python -m
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield name
    sys.modules.pop(name, None)
    sys.modules.pop("broken_on_import", None)


@pytest.mark.parametrize("attribute", ["plain", "coro", "Jobs.build"])
def test_a_valid_handler_resolves_to_the_callable(module: str, attribute: str) -> None:
    handler = load_handler(f"{module}:{attribute}")
    assert callable(handler)
    assert handler.__name__ == attribute.rpartition(".")[2]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("no_colon_here", "expected the form pkg.module:func"),
        (":func", "expected the form pkg.module:func"),
        ("module:", "expected the form pkg.module:func"),
        (
            "surely_not_a_module_xyz:func",
            "cannot import surely_not_a_module_xyz: ModuleNotFoundError",
        ),
        ("broken_on_import:func", "cannot import broken_on_import: RuntimeError: no config"),
        ("{module}:missing", "has no missing"),
        ("{module}:Jobs.missing", "has no Jobs.missing"),
        ("{module}:NOT_CALLABLE", "NOT_CALLABLE is not callable"),
    ],
)
def test_a_bad_handler_is_one_line_naming_the_problem(module: str, spec: str, problem: str) -> None:
    with pytest.raises(HandlerError) as caught:
        load_handler(spec.format(module=module))
    message = str(caught.value)
    assert problem in message
    assert message.startswith("--handler ")
    assert "\n" not in message
