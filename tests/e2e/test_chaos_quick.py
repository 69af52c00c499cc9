"""The chaos soak's quick run (`bench/chaos.py --quick`) against the test servers: agents
SIGKILLed at random, one conductor restart, poison issues; nothing lost, nothing done twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from redis.asyncio import Redis

from .fleet import REPO

pytestmark = pytest.mark.timeout(240)


def count(output: str, name: str) -> int:
    found = re.search(rf"^{re.escape(name)}: (\d+)", output, re.MULTILINE)
    assert found, f"no {name!r} line in:\n{output}"
    return int(found.group(1))


async def test_the_quick_chaos_soak_loses_nothing_and_commits_nothing_twice(
    redis: Redis, redis_url: str, database_url: str
) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(RIG_BENCH_REDIS_URL=redis_url, RIG_BENCH_DATABASE_URL=database_url)
    done = subprocess.run(  # noqa: ASYNC221 - the test has nothing else to do meanwhile
        [sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", "--seed", "7"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=200,
    )
    output = done.stdout
    assert done.returncode == 0, f"{output}\n{done.stderr[-3000:]}"
    assert count(output, "dispatched") == 100
    assert count(output, "lost") == 0
    assert count(output, "double-committed effects") == 0
    assert count(output, "missing effects") == 0
    assert count(output, "completed") + count(output, "dead-lettered") == 100
    assert "(poison 2 of 2, other 0;" in output
    assert count(output, "agent kills") > 0 and count(output, "conductor restarts") == 1
    assert "result: PASS" in output
