"""How `make test` shares the suite among workers: Spark files on one worker, handed out first;
every other file a unit of its own; and a Redis database per worker on configured servers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import distribution
from tests.conftest import worker_database

TESTS = Path(__file__).resolve().parents[1]


def test_every_file_that_starts_spark_is_in_the_spark_unit() -> None:
    starts_spark = {
        path.relative_to(TESTS.parent).as_posix()
        for path in TESTS.rglob("test_*.py")
        if re.search(r"\b(spark|cluster)_fixture\b", path.read_text())
    }
    assert starts_spark, "no test file imports the Spark fixtures any more"
    assert starts_spark == distribution.SPARK_FILES


def test_the_spark_files_form_one_unit_and_the_rest_a_unit_per_file() -> None:
    audits = [f"{path}::test_x[1M]" for path in sorted(distribution.SPARK_FILES)]
    assert {distribution.unit_of(nodeid) for nodeid in audits} == {distribution.SPARK}
    assert distribution.unit_of("tests/e2e/test_hung_e2e.py::test_hang[x]") == (
        "tests/e2e/test_hung_e2e.py"
    )


def test_the_spark_unit_goes_out_first_then_the_slow_tiers() -> None:
    nodeids = [
        "tests/unit/test_logs.py::test_a",
        "tests/integration/test_api.py::test_b",
        "tests/spark/test_audit_reconcile.py::test_c",
        "tests/topologies/test_core_loop.py::test_d",
        "tests/e2e/test_hung_e2e.py::test_e",
        "tests/prometheus/test_rules.py::test_f",
    ]
    assert sorted(nodeids, key=distribution.rank) == [
        "tests/spark/test_audit_reconcile.py::test_c",
        "tests/topologies/test_core_loop.py::test_d",
        "tests/e2e/test_hung_e2e.py::test_e",
        "tests/integration/test_api.py::test_b",
        "tests/unit/test_logs.py::test_a",
        "tests/prometheus/test_rules.py::test_f",
    ]


@pytest.mark.parametrize(
    ("worker", "url", "expected"),
    [
        (None, "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/15"),
        ("gw0", "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/15"),
        ("gw2", "redis://127.0.0.1:6379/15", "redis://127.0.0.1:6379/13"),
        (
            "gw1",
            "rediss://u:p@host:6380/4?ssl_cert_reqs=none",
            "rediss://u:p@host:6380/3?ssl_cert_reqs=none",
        ),
    ],
)
def test_each_worker_flushes_a_redis_database_of_its_own(
    monkeypatch: pytest.MonkeyPatch, worker: str | None, url: str, expected: str
) -> None:
    if worker is None:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    else:
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert worker_database(url) == expected


def test_a_database_too_low_for_the_workers_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    with pytest.raises(pytest.UsageError, match="database 1: too low for worker gw2"):
        worker_database("redis://127.0.0.1:6379/1")
