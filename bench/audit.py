"""Audit benchmark: events audited per second by the audit job, warm, on local[2] and on a Spark
standalone cluster, against a plain JDBC -> Parquet copy of the same rows; the driver's peak RSS.

    .venv/bin/python bench/audit.py                  # 1M and 5M events, both masters
    .venv/bin/python bench/audit.py --quick          # 200k events, local[2] only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import pyspark
import redis
from pyspark.sql import SparkSession

import harness
from harness import BenchError, conninfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.spark import planted as planter
from tests.spark.cluster import SparkCluster

from rig_conductor.audit import job, session, sources
from rig_conductor.settings import Settings

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/rig_bench_audit"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
WARMUP_EVENTS = 50_000
HEAD = "    master     events  audit s     ev/s  copy ev/s  ratio  driver RSS     anon"
GENERATOR = "planted-v1"  # bump when tests/spark/planted.py changes: stored logs are rebuilt


def dataset(url: str, events: int) -> planter.Planted:
    """The planted tenant of about `events` events, loaded unless a run stored it already."""
    tenant, entries = f"bench-{events}", planter.entries_for(events)
    per_role = max(5, entries // 200)
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_audit_datasets (tenant text PRIMARY KEY, "
            "generator text NOT NULL)"
        )
        stored = "SELECT 1 FROM bench_audit_datasets WHERE tenant = %s AND generator = %s"
        if conn.execute(stored, (tenant, GENERATOR)).fetchone():
            return planter.describe(tenant, entries, per_role)
        started = time.perf_counter()
        log = planter.plant(conninfo(url), tenant, entries, per_role)
        conn.execute(
            "INSERT INTO bench_audit_datasets VALUES (%s, %s) ON CONFLICT (tenant) "
            "DO UPDATE SET generator = excluded.generator",
            (tenant, GENERATOR),
        )
        print(f"planted {tenant}: {log.events:,} events in {time.perf_counter() - started:.0f} s")
        return log


def tree_rss_mb(root: int, skip: frozenset[int]) -> tuple[float, float]:
    """Resident memory of `root` and its descendants (the driver's JVM) but `skip` and theirs
    (the standalone cluster): all of it, and the anonymous part (heap and native allocations;
    the rest is file pages, such as the shuffle files the JVM maps)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):  # gone meanwhile
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(stat.parent.name))
    todo, total, anon = [root], 0.0, 0.0
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        kb = harness.proc_kb(pid)
        total += kb.get("RssAnon", 0) + kb.get("RssFile", 0) + kb.get("RssShmem", 0)
        anon += kb.get("RssAnon", 0)
        todo += children.get(pid, [])
    return total / 1024, anon / 1024


@dataclass
class Result:
    master: str
    events: int
    audit_s: float
    copy_s: float
    rss_mb: float
    anon_mb: float
    timings: dict[str, int]


def audit(
    spark: SparkSession, args: argparse.Namespace, log: planter.Planted, out: Path,
    skip: frozenset[int],
) -> Result:  # fmt: skip
    """One audit of `log` in the running session, checked against what was planted; the peak
    RSS of this process and its descendants but `skip`, sampled every 100 ms."""
    settings = Settings(database_url=args.url, redis_url=args.redis_url, tenant=log.tenant)
    options = session.AuditOptions(output=out, until=log.until)
    client = redis.Redis.from_url(args.redis_url, decode_responses=True)
    planter.plant_redis(client, log)
    client.close()
    source, timings = sources.jdbc_source(settings.sqlalchemy_url), dict[str, int]()
    with harness.peaks(lambda: tree_rss_mb(os.getpid(), skip), every=0.1) as peak:
        started = time.perf_counter()
        summary = job.run(spark, settings=settings, options=options, source=source, timings=timings)
        seconds = time.perf_counter() - started
    found = {k: summary[k] for k in ("dispatched", "completed", "deadLettered", "pending")}
    found |= {"lost": summary["lostCount"], "duplicates": summary["duplicateCount"]}
    found["reclaims"] = summary["reclaims"]
    if found != log.expected() or summary["reclaimsByReason"] != log.by_reason():
        raise BenchError(f"{log.tenant}: found {found}, planted {log.expected()}")
    return Result("", summary["events"], seconds, 0.0, peak[0], peak[1], timings)


def copy(spark: SparkSession, url: str, log: planter.Planted, out: Path, partitions: int) -> float:
    """The baseline: the same rows over JDBC in as many partitions, written as Parquet; seconds."""
    with psycopg.connect(conninfo(url)) as conn:
        low, high = conn.execute(
            "SELECT min(id), max(id) FROM events WHERE tenant = %s", (log.tenant,)
        ).fetchone() or (0, 0)
    started = time.perf_counter()
    table = f"(SELECT * FROM events WHERE tenant = '{log.tenant}') AS audited"
    reader = spark.read.format("jdbc").options(
        **sources.jdbc_source(url).options(), dbtable=table, fetchsize="10000"
    )
    if partitions > 1:
        bounds = {"lowerBound": str(low), "upperBound": str(high + 1)}
        reader = reader.options(partitionColumn="id", numPartitions=str(partitions), **bounds)
    reader.load().write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def run_master(name: str, args: argparse.Namespace) -> list[Result]:
    """Every log audited in one session on `name` (standalone: a cluster started here), a
    warm-up first (not reported), then each followed by its baseline copy."""
    with tempfile.TemporaryDirectory(prefix="rig-bench-audit-") as scratch, ExitStack() as stack:
        master, skip = name, frozenset[int]()
        if name == "standalone":
            cluster = SparkCluster(Path(scratch, "spark")).start()
            stack.callback(cluster.stop)
            master, skip = cluster.url, frozenset(p.pid for p in cluster.processes.values())
        root = Path(scratch, name.strip("]").replace("[", "-"))
        conf = (("spark.driver.memory", args.driver_memory), ("spark.executor.memory", "1g"))
        options = session.AuditOptions(output=root, master=master, conf=conf, jdbc_jar=args.jar)
        started = time.perf_counter()
        spark, _ = session.spark_session(options)
        stack.callback(spark.stop)
        print(f"{name}: Spark started in {time.perf_counter() - started:.1f} s", flush=True)
        results = []
        for n, log in enumerate(args.logs):
            result = audit(spark, args, log, root / log.tenant, skip)
            if n == 0:
                print(f"{name}: warm-up, {result.events:,} events in {result.audit_s:.1f} s")
                continue
            parallelism = spark.sparkContext.defaultParallelism
            partitions = sources.partitions_for(result.events, parallelism=parallelism)
            result.copy_s = copy(spark, args.url, log, root / f"{log.tenant}-copy", partitions)
            result.master = name
            results.append(result)
            print(f"{name}: {result.events:,} events audited in {result.audit_s:.1f} s "
                  f"{result.timings}, copy {result.copy_s:.1f} s", flush=True)  # fmt: skip
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000000,5000000", help="comma list of event counts")
    parser.add_argument("--masters", default="local[2],standalone")
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory")
    parser.add_argument("--quick", action="store_true", help="200k events on local[2] only")
    parser.add_argument("--results", help=argparse.SUPPRESS)  # a child's results, as JSON
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.masters = "200000", "local[2]"
    args.jar = Path(os.environ.get(session.JDBC_JAR_ENV) or session.DEFAULT_JDBC_JAR)
    if not os.environ.get(session.JDBC_JAR_ENV):  # Debian's driver, where CI installs it
        harness.ensure_installed("libpostgresql-jdbc-java", args.jar.is_file)
    if not args.jar.is_file():
        raise BenchError(f"no JDBC driver at {args.jar} (set {session.JDBC_JAR_ENV})")
    with harness.servers(DEFAULT_REDIS, DEFAULT_DATABASE) as found:
        args.url, args.redis_url = found.database_url, found.redis_url
        sizes = [WARMUP_EVENTS] + [int(s.replace("_", "")) for s in args.sizes.split(",")]
        args.logs = [dataset(args.url, size) for size in sizes]
        masters = args.masters.split(",")
        if len(masters) > 1:
            # One process per master: PySpark keeps its JVM for the life of the process, so a
            # master run after another would inherit its heap (and its RSS) in the driver.
            results = [r for name in masters for r in in_own_process(name, args)]
        else:
            results = run_master(masters[0], args)
    if args.results:
        Path(args.results).write_text(json.dumps([asdict(r) for r in results]))
    else:
        report(results, args.driver_memory)
    return 0


def in_own_process(master: str, args: argparse.Namespace) -> list[Result]:
    """This benchmark on one master, run as a child process; its results."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, f"--sizes={args.sizes}", f"--masters={master}"]
        command += [f"--driver-memory={args.driver_memory}", f"--results={out.name}"]
        if subprocess.run(command, check=False).returncode != 0:
            raise BenchError(f"the run on {master} failed")
        return [Result(**r) for r in json.loads(Path(out.name).read_text())]


def report(results: list[Result], memory: str) -> None:
    print(
        f"\nPySpark {pyspark.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores (shared: timings are noisy), driver memory {memory}; "
        "standalone = 2 workers of 1 core, executors 1g; warm: after a 50k-event run"
    )
    print(f"{HEAD}\n{'-' * len(HEAD)}")
    rates = {(r.master, r.events): r.events / r.audit_s for r in results}
    for r in results:
        rate, baseline = r.events / r.audit_s, r.events / r.copy_s
        print(f"{r.master:>10} {r.events:>10,} {r.audit_s:>8.1f} {rate:>8,.0f} {baseline:>10,.0f} "
              f"{rate / baseline:>6.2f} {r.rss_mb:>8,.0f} MB {r.anon_mb:>5,.0f} MB")  # fmt: skip
    big = max((r.events for r in results), default=0)
    if ("local[2]", big) in rates:
        harness.goal(f"local[2] events/s at {big:,}", rates["local[2]", big], ">=", 100_000)
    if ("local[2]", big) in rates and ("standalone", big) in rates:
        ratio = rates["standalone", big] / rates["local[2]", big]
        harness.goal(f"standalone / local[2] at {big:,}", ratio, ">=", 0.8)


if __name__ == "__main__":
    sys.exit(harness.run(main))
