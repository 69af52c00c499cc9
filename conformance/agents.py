"""The agent implementations the suite knows by name, and any other as a command line.

`--agent python`, `--agent typescript`, `--agent broken:<flaw>` (`broken/agent.py`), or
`--agent "<command line>"`: a program that runs one agent with the conformance handler
(README.md), given `--agent-id ID --group G --stream S` after the command line and its settings
in the environment (`RIG_*`, `CONSUMER_ID`, `CONFORMANCE_OUT`).
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TYPESCRIPT = REPO / "clients" / "typescript"


@dataclass(frozen=True)
class AgentUnderTest:
    name: str
    command: tuple[str, ...]
    # The TypeScript package must be built before its command runs (`npm ci && npm run build`).
    needs_typescript_build: bool = False


def resolve(spec: str) -> AgentUnderTest:
    """The implementation `spec` names; a ValueError naming the problem otherwise."""
    python_handler = ("--handler", "conformance.handlers.handler:handle")
    if spec == "python":
        return AgentUnderTest(
            spec, (sys.executable, "-m", "rig_conductor", "agent", *python_handler)
        )
    if spec == "typescript":
        command = ("node", str(TYPESCRIPT / "dist" / "bin.js"))
        handler = ("--handler", str(HERE / "handlers" / "handler.mjs"))
        return AgentUnderTest(spec, (*command, *handler), needs_typescript_build=True)
    if spec.startswith("broken:"):
        from conformance.broken.agent import FLAWS

        flaw = spec.removeprefix("broken:")
        if flaw not in FLAWS:
            raise ValueError(f"--agent {spec}: no such broken agent (one of {', '.join(FLAWS)})")
        script = str(HERE / "broken" / "agent.py")
        return AgentUnderTest(spec, (sys.executable, script, flaw, *python_handler))
    command = tuple(shlex.split(spec))
    if not command:
        raise ValueError("--agent: empty command line")
    return AgentUnderTest(spec, command)
