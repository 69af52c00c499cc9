"""The audit at scale: the same planted-anomaly assertions on a small log and on one of a
million events, on local[2] and on a real standalone cluster (a master and two one-core
workers), run as users run it: `rig-conductor audit` as a process.

The log is synthetic (tests/spark/planted.py, loaded with COPY) with lost entries, duplicate
work by a fenced zombie, entries still pending in Redis, reclaims for each reason and dead
letters drawn at random over the whole id range, so every JDBC partition holds some. Every
planted finding must be found and nothing else: precision and recall 1.0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import redis
from sqlalchemy.engine import make_url

from rig_conductor.adapters.postgres import migrations
from tests.audit_conftest import (  # noqa: F401
    JDBC_JAR,
    cluster_fixture,
    jdbc_ready_fixture,
    require_pyspark,
    spark_fixture,
    unavailable,
)
from tests.spark import planted as planter

require_pyspark()

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.timeout(1500)

# (dispatched entries, entries per anomalous role): about 650 and 1,000,000 events.
SIZES = {"small": (200, 4), "1M": (planter.entries_for(1_000_000), 1_500)}


def _conninfo(url: str, database: str | None = None) -> str:
    target = make_url(url).set(drivername="postgresql")
    if database is not None:
        target = target.set(database=database)
    return target.render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def scale_db(jdbc_ready: str) -> Iterator[tuple[str, dict[str, planter.Planted]]]:
    """A database of its own holding both planted logs (a tenant each), built once."""
    name = f"rig_test_scale_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(_conninfo(jdbc_ready), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(jdbc_ready).set(database=name).render_as_string(hide_password=False)
    try:
        migrations.upgrade(url)
        logs = {
            size: planter.plant(_conninfo(url), f"scale-{size}", entries, per_role)
            for size, (entries, per_role) in SIZES.items()
        }
        yield url, logs
    finally:
        with psycopg.connect(_conninfo(jdbc_ready), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def run_audit(
    database_url: str, redis_url: str, log: planter.Planted, out: Path, master: str
) -> dict[str, Any]:
    """`rig-conductor audit` as a process: the summary it wrote."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(
        RIG_REDIS_URL=redis_url,
        RIG_DATABASE_URL=database_url,
        RIG_TENANT=log.tenant,
        RIG_JDBC_JAR=str(JDBC_JAR),
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    command = [sys.executable, "-m", "rig_conductor", "audit", "--output", str(out)]
    command += ["--master", master, "--until", log.until.isoformat()]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary


def entries_of(rows: list[Any]) -> set[tuple[str, str]]:
    return {(r["stream"], r["entry_id"]) for r in rows}


@pytest.mark.parametrize("master", ["local", "standalone"])
@pytest.mark.parametrize("size", list(SIZES))
def test_the_audit_finds_exactly_the_planted_anomalies(
    size: str,
    master: str,
    scale_db: tuple[str, dict[str, planter.Planted]],
    redis_url: str,
    spark: SparkSession,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    from pyspark.sql import functions as F

    database_url, logs = scale_db
    log = logs[size]
    url = "local[2]" if master == "local" else request.getfixturevalue("cluster").url
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        planter.plant_redis(client, log)  # per test: other tests flush this Redis database
    finally:
        client.close()
    # The anomalies are spread: every quarter of the log holds some of each kind.
    for found in (log.lost, log.pending, log.dead):
        quarters = {int(e.split("-")[0]) - 1_700_000_000_000 for _, e in found}
        assert {4 * i // log.entries for i in quarters} == {0, 1, 2, 3}

    started = time.monotonic()
    summary = run_audit(database_url, redis_url, log, tmp_path / "out", url)
    print(f"{size} on {master}: {summary['events']:,} events audited in "
          f"{time.monotonic() - started:.1f} s ({summary.get('timingsMs')})")  # fmt: skip

    assert summary["events"] == log.events
    counts = {k: summary[k] for k in ("dispatched", "completed", "deadLettered", "pending")}
    counts |= {"lost": summary["lostCount"], "duplicates": summary["duplicateCount"]}
    counts["reclaims"] = summary["reclaims"]
    assert counts == log.expected()
    assert summary["reclaimsByReason"] == log.by_reason()
    assert set(log.by_reason()) == {"down", "pod-gone", "degraded"}
    # summary.json lists every one, as the contract says, and as the Parquet tables do.
    assert len(summary["lost"]) == len(log.lost)
    assert {(d["stream"], d["entryId"]) for d in summary["lost"]} == log.lost
    assert {d["issueId"] for d in summary["duplicates"]} == log.duplicates

    read = spark.read.parquet
    out = tmp_path / "out"
    assert entries_of(read(str(out / "lost")).collect()) == log.lost
    duplicates = read(str(out / "duplicates")).select("issue_id", "reasons").collect()
    assert {r["issue_id"] for r in duplicates} == log.duplicates
    assert {tuple(r["reasons"]) for r in duplicates} == {("overlapping-attempts",)}
    status = read(str(out / "entries")).where(F.col("status").isin("pending", "dead_lettered"))
    rows = status.select("stream", "entry_id", "status").collect()
    assert entries_of([r for r in rows if r["status"] == "pending"]) == log.pending
    assert entries_of([r for r in rows if r["status"] == "dead_lettered"]) == log.dead
    reclaims = read(str(out / "reclaims")).select("stream", "entry_id", "reason").collect()
    by_reason: dict[str, set[tuple[str, str]]] = {}
    for r in reclaims:
        by_reason.setdefault(r["reason"], set()).add((r["stream"], r["entry_id"]))
    assert by_reason == log.reclaimed
    assert len(reclaims) == sum(len(found) for found in log.reclaimed.values())
