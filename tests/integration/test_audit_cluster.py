"""The audit on a real Spark standalone cluster (a master and two one-core workers started from
the pyspark wheel), as users run it: `rig-conductor audit --master spark://...` as a process.

It finds exactly what local mode finds over the same planted event log; the executors read
PostgreSQL in parallel JDBC partitions and tasks run on both workers (Spark's event log says
so); the JDBC jar reaches them with no download; and a worker killed mid-job (with its
executor) costs task retries, not the result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings
from tests.audit_conftest import (  # noqa: F401
    JDBC_JAR,
    cluster_fixture,
    jdbc_ready_fixture,
    require_pyspark,
    unavailable,
)
from tests.integration.test_audit import S, World, build
from tests.spark.cluster import SparkCluster

require_pyspark()

pytestmark = pytest.mark.timeout(1500)

# What local mode and the cluster must agree on: the contract's summary and the breakdowns.
COMPARED = (
    "dispatched", "completed", "deadLettered", "pending", "lost", "duplicates", "reclaims",
    "reclaimLatencyMs", "reclaimsByReason", "pendingInPel", "pendingUndelivered", "requeued",
)  # fmt: skip


def audit(
    settings: Settings, out: Path, *args: str, on_start: Callable[[], None] | None = None
) -> tuple[dict[str, Any], str]:
    """`rig-conductor audit` as a process over `settings`' servers: (summary, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    env.update(
        RIG_REDIS_URL=settings.redis_url,
        RIG_DATABASE_URL=settings.database_url,
        RIG_STREAMS=",".join(settings.streams),
        RIG_DISPATCH_STREAM=settings.dispatch_stream,
        RIG_JDBC_JAR=str(JDBC_JAR),
        PYSPARK_PYTHON=sys.executable,  # the executors run the driver's Python, as Spark requires
        SPARK_LOCAL_IP="127.0.0.1",
    )
    command = [sys.executable, "-m", "rig_conductor", "audit", "--output", str(out), *args]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if on_start is not None:
        threading.Thread(target=on_start, daemon=True).start()
    try:
        _, stderr = process.communicate(timeout=1200)
    finally:  # a timeout, or the test stopped: the job must not outlive it
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr[-4000:]
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    return summary, stderr


def executors_of_tasks(event_dir: Path) -> set[str]:
    """Executor ids that ran tasks, from Spark's event log."""
    found: set[str] = set()
    for log in event_dir.rglob("events_*"):
        for line in log.read_text(errors="replace").splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                found.add(str(event["Task Info"]["Executor ID"]))
    return found


async def test_the_cluster_finds_what_local_mode_finds_reading_in_parallel(
    jdbc_ready: str,
    cluster: SparkCluster,
    redis: Redis,
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    await build(World(redis, engine), make_settings)
    settings = make_settings(streams=(S, "assignments:*"), dispatch_stream=S)
    local, _ = audit(settings, tmp_path / "local", "--master", "local[2]")
    events = tmp_path / "events"
    events.mkdir()
    remote, stderr = audit(
        settings,
        tmp_path / "cluster",
        "--master", cluster.url,
        "--partitions", "4",
        "--conf", "spark.eventLog.enabled=true",
        "--conf", f"spark.eventLog.dir=file://{events}",
        "--conf", "spark.eventLog.compress=false",
        "--conf", "spark.executor.memory=512m",
    )  # fmt: skip
    assert {k: remote[k] for k in COMPARED} == {k: local[k] for k in COMPARED}
    assert "in 4 JDBC partitions" in stderr, stderr[-3000:]
    assert len(executors_of_tasks(events) - {"driver"}) == 2  # both workers' executors worked


async def test_a_worker_killed_mid_job_costs_retries_not_the_result(
    jdbc_ready: str,
    cluster: SparkCluster,
    redis: Redis,
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    await build(World(redis, engine), make_settings)
    settings = make_settings(streams=(S, "assignments:*"), dispatch_stream=S)
    local, _ = audit(settings, tmp_path / "local", "--master", "local[2]")

    def kill_when_both_executors_run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            apps = cluster.state().get("activeapps", [])
            if apps and apps[0].get("cores", 0) >= 2:
                time.sleep(2)  # into the job
                cluster.kill_worker(1)
                return
            time.sleep(0.2)

    try:
        remote, _ = audit(
            settings,
            tmp_path / "cluster",
            "--master", cluster.url,
            "--partitions", "4",
            "--conf", "spark.executor.memory=512m",
            on_start=kill_when_both_executors_run,
        )  # fmt: skip
        assert "worker-1" not in cluster.processes, "the worker was never killed"
        assert {k: remote[k] for k in COMPARED} == {k: local[k] for k in COMPARED}
    finally:
        if "worker-1" not in cluster.processes:
            cluster.start_worker(1)
            cluster.wait_for_workers(2)
