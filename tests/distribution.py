"""How `make test` shares the suite among pytest-xdist workers.

Most of the suite waits on servers, subprocesses and timers: a serial run leaves two cores
80-98% idle. The Spark audits are the exception: each one keeps both cores busy, and three at
once (plain `--dist loadfile` put them on three workers) slowed every worker down.

So a test file is the unit of work, as with `--dist loadfile`, except that every file that
starts Spark forms one unit, handed out first: one worker runs the audits one after another
while the others share the rest, slowest tiers first. Files in one unit share a worker, which
also keeps one session-scoped SparkSession for all of them.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

# Every test file that starts Spark (tests/unit/test_distribution.py keeps this list whole).
SPARK_FILES = frozenset(
    {
        "tests/integration/test_audit.py",
        "tests/integration/test_audit_at_scale.py",
        "tests/integration/test_audit_cluster.py",
        "tests/spark/test_audit_reconcile.py",
    }
)
SPARK = "spark"
# After the Spark unit: the tiers with the slowest files first, so no worker is handed a long
# file while the others are finishing.
TIERS = ("tests/topologies/", "tests/e2e/", "tests/browser/", "tests/integration/", "tests/unit/")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: the Spark unit, or its file."""
    path = nodeid.split("::", 1)[0]
    return SPARK if path in SPARK_FILES else path


def rank(nodeid: str) -> int:
    """Where a test's unit is handed out: the Spark unit first, then tier by tier."""
    path = unit_of(nodeid)
    if path == SPARK:
        return 0
    return 1 + next((i for i, tier in enumerate(TIERS) if path.startswith(tier)), len(TIERS))


class SparkApart(LoadScopeScheduling):
    """Load scheduling by file, with the Spark files gathered into one unit."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> SparkApart:
    # Units go out in collection order (sorted by `rank` below), not by their number of tests.
    config.option.loadscopereorder = False
    return SparkApart(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Stable: within a unit, and within a tier, the collection order stands.
    items.sort(key=lambda item: rank(item.nodeid))
