"""What `rig-conductor reap --once` loads before its scan: start-up is time a one-shot run
spends before Redis has anything to do (docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys

# The command line built, and the modules of a scan: what `reap --once` imports.
REAP_IMPORTS = """
import sys
from rig_conductor import cli
cli.build_parser()
from rig_conductor.effects import port
from rig_conductor.reaper import cycle
print(",".join(sorted(name for name in ("httpx", "fastapi", "uvicorn") if name in sys.modules)))
"""


def test_reap_starts_without_the_http_stack() -> None:
    """The operator commands' HTTP client, the API and its server load only for the commands
    that use them."""
    done = subprocess.run(
        [sys.executable, "-c", REAP_IMPORTS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_an_operator_command_still_reaches_its_client() -> None:
    """The client's HTTP library is imported where a command calls the API: a bad URL is still
    named, not a NameError."""
    from rig_conductor.ops_cli import client

    try:
        client.target({"RIG_CONDUCTOR_URL": "http://[::1"})
    except client.Stop as stop:
        assert stop.code == client.EXIT_USAGE
        assert "RIG_CONDUCTOR_URL" in stop.message
    else:
        raise AssertionError("a URL with an open bracket was taken")
