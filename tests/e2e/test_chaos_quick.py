"""The chaos soak's quick run (`bench/chaos.py --quick`) on a PostgreSQL and a Redis of its own:
agents SIGKILLed at random, one conductor restart, PostgreSQL stopped and started, every
conductor stopped longer than RIG_AGENT_DOWN_MS, Redis restarted empty, poison issues; nothing
lost, nothing done twice, no completed issue without its output (none excused), no live agent
reclaimed because of a blind spell. A failure's output holds each wrong issue's timeline."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.integration.ts_agent import rig_agent_fixture  # noqa: F401 - the `rig_agent` fixture
from tests.needs import missing

from .fleet import REPO

# About 80 s on a quiet two-core machine; the faults' outages and restarts take most of it, and
# a conductor's start-up takes several times longer when the machine is loaded.
pytestmark = pytest.mark.timeout(300)


def count(output: str, name: str) -> int:
    found = re.search(rf"^{re.escape(name)}: (\d+)", output, re.MULTILINE)
    assert found, f"no {name!r} line in:\n{output}"
    return int(found.group(1))


def soak(*options: str) -> str:
    """`bench/chaos.py --quick` with `options`; its output."""
    postgres = shutil.which("initdb") or glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if not (postgres and shutil.which("redis-server")):
        missing("initdb and redis-server are needed (Debian: postgresql, redis-server)")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", *options],
        env=environment,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_quick_chaos_soak_loses_nothing_and_commits_nothing_twice() -> None:
    output = soak("--seed", "7")
    assert count(output, "dispatched") == 100
    assert count(output, "lost") == 0
    assert count(output, "double-committed effects") == 0
    assert count(output, "missing effects") == 0
    assert count(output, "completed") + count(output, "dead-lettered") == 100
    assert "(poison 2 of 2, other 0;" in output
    assert count(output, "agent kills") > 0 and count(output, "conductor restarts") == 1
    assert count(output, "postgres restarts") >= 1
    assert count(output, "conductor outages") >= 1
    assert count(output, "redis restarts") >= 1
    # Every outage and restart is a spell the conductor could not hear, and it saw each end.
    assert count(output, "blind spells") >= 3
    assert count(output, "redis data losses seen") >= 1
    assert count(output, "reclaims") > 0 and "reclaims by reason: " in output
    assert count(output, "live agents reclaimed by blind spells") == 0
    assert "result: PASS" in output


def test_a_mixed_fleet_in_two_groups_under_its_own_redis_users_loses_nothing(
    rig_agent: list[str],
) -> None:
    """Python and TypeScript agents share each of two groups reading one stream, every agent
    signed in as its own least-privilege Redis user, through the same faults, Redis restarted
    empty included: each group finishes every issue once."""
    output = soak("--seed", "2", "--fleet", "mixed", "--groups", "2", "--agent-users")
    assert count(output, "dispatched") == 100
    assert re.search(r"^lost: 0 \(chaos 0, chaos2 0\)", output, re.MULTILINE), output
    assert re.search(r"^double-committed effects: 0 \(chaos 0, chaos2 0\)", output, re.MULTILINE)
    assert re.search(r"^missing effects: 0 \(chaos 0, chaos2 0\)", output, re.MULTILINE)
    assert count(output, "redis restarts") >= 1
    users = re.search(r"^agent redis users: (\d+) \(seen connected: (\d+)\)", output, re.MULTILINE)
    assert users and users.group(1) == users.group(2) != "0", output
    assert count(output, "NOPERM refusals") == 0
    assert "result: PASS" in output
