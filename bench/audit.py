"""Audit benchmark: events audited per second by the audit job, warm, on local[2] and on a Spark
standalone cluster of two one-core workers (started from the pyspark wheel), against a plain
JDBC -> Parquet copy of the same rows in the same session as the baseline; and the driver's peak
RSS (this process and its JVM: in local mode the executors live there too), all of it and its
anonymous part (without the file pages of mapped shuffle files).

    .venv/bin/python bench/audit.py                  # 1M and 5M events, both masters
    .venv/bin/python bench/audit.py --quick          # 200k events, local[2] only

PostgreSQL: RIG_BENCH_DATABASE_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/
rig_bench_audit; created and migrated when missing). Each size is a tenant (`bench-<size>`),
planted by tests/spark/planted.py with COPY once and kept (a planted log with known lost,
duplicate, pending, reclaimed and dead-lettered entries: every run checks the findings).
Redis: RIG_BENCH_REDIS_URL (default redis://127.0.0.1:6379/13) receives the pending entries.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg
import redis
from pyspark.sql import SparkSession

from harness import BenchError, conninfo, ensure_database, goal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.spark import planted as planter
from tests.spark.cluster import SparkCluster

from rig_conductor.adapters.postgres import migrations
from rig_conductor.audit import job, session, sources
from rig_conductor.settings import Settings

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/rig_bench_audit"
DEFAULT_REDIS = "redis://127.0.0.1:6379/13"
WARMUP_EVENTS = 50_000
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
        found = conn.execute(
            "SELECT 1 FROM bench_audit_datasets WHERE tenant = %s AND generator = %s",
            (tenant, GENERATOR),
        ).fetchone()
        if found:
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


def tree_rss_mb(root: int, skip: frozenset[int] = frozenset()) -> tuple[float, float]:
    """Resident memory of `root` and its descendants (the driver's JVM), from /proc: all of it,
    and the anonymous part (heap and native allocations; the rest is file pages, such as the
    shuffle files the JVM maps). Not of the processes in `skip` and theirs (the standalone
    cluster's master and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    todo, total, anon = [root], 0.0, 0.0
    while todo:
        pid = todo.pop()
        if pid in skip:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            continue
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith("Rss")}
        total += kb.get("RssAnon", 0) + kb.get("RssFile", 0) + kb.get("RssShmem", 0)
        anon += kb.get("RssAnon", 0)
        todo += children.get(pid, [])
    return total / 1024, anon / 1024


@contextmanager
def peak_rss(skip: frozenset[int]) -> Iterator[list[float]]:
    """The peaks of `tree_rss_mb(this process)` (all, anonymous) while the block runs, sampled
    every 100 ms."""
    peak, done = [0.0, 0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            total, anon = tree_rss_mb(os.getpid(), skip)
            peak[0], peak[1] = max(peak[0], total), max(peak[1], anon)
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


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
    spark: SparkSession,
    url: str,
    redis_url: str,
    log: planter.Planted,
    out: Path,
    skip: frozenset[int] = frozenset(),
) -> Result:
    """One audit of `log` in the running session, checked against what was planted."""
    settings = Settings(database_url=url, redis_url=redis_url, tenant=log.tenant)
    options = session.AuditOptions(output=out, until=log.until)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    planter.plant_redis(client, log)
    client.close()
    timings: dict[str, int] = {}
    with peak_rss(skip) as peak:
        started = time.perf_counter()
        summary = job.run(
            spark,
            settings=settings,
            options=options,
            source=sources.jdbc_source(settings.sqlalchemy_url),
            timings=timings,
        )
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


def run_master(name: str, master: str, args: argparse.Namespace, logs: list[planter.Planted],
               url: str, redis_url: str, root: Path, skip: frozenset[int],
               ) -> list[Result]:  # fmt: skip
    """Every log audited in one session on `master`, a warm-up first (not reported)."""
    conf = (("spark.driver.memory", args.driver_memory), ("spark.executor.memory", "1g"))
    options = session.AuditOptions(output=root, master=master, conf=conf, jdbc_jar=args.jar)
    started = time.perf_counter()
    spark, _ = session.spark_session(options)
    print(f"{name}: Spark started in {time.perf_counter() - started:.1f} s", flush=True)
    results = []
    try:
        for n, log in enumerate(logs):
            result = audit(spark, url, redis_url, log, root / log.tenant, skip)
            if n == 0:
                print(f"{name}: warm-up, {result.events:,} events in {result.audit_s:.1f} s")
                continue
            partitions = sources.partitions_for(
                result.events, parallelism=spark.sparkContext.defaultParallelism
            )
            result.copy_s = copy(spark, url, log, root / f"{log.tenant}-copy", partitions)
            result.master = name
            results.append(result)
            print(f"{name}: {result.events:,} events audited in {result.audit_s:.1f} s "
                  f"{result.timings}, copy {result.copy_s:.1f} s", flush=True)  # fmt: skip
    finally:
        spark.stop()
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
    if not args.jar.is_file():
        raise BenchError(f"no JDBC driver at {args.jar} (set {session.JDBC_JAR_ENV})")
    url = os.environ.get("RIG_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL", DEFAULT_REDIS)
    ensure_database(url)
    migrations.upgrade(url)
    sizes = [WARMUP_EVENTS] + [int(s.replace("_", "")) for s in args.sizes.split(",")]
    logs = [dataset(url, size) for size in sizes]
    masters = args.masters.split(",")
    if len(masters) > 1:
        # One process per master: PySpark keeps its JVM for the life of the process, so a
        # master run after another would inherit its heap (and its RSS) in the driver.
        results = [r for name in masters for r in in_own_process(name, args)]
    else:
        results = run_here(masters[0], args, logs, url, redis_url)
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


def run_here(
    name: str, args: argparse.Namespace, logs: list[planter.Planted], url: str, redis_url: str
) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="rig-bench-audit-") as scratch:
        cluster = SparkCluster(Path(scratch, "spark")).start() if name == "standalone" else None
        try:
            master = cluster.url if cluster else name
            skip = frozenset(p.pid for p in cluster.processes.values()) if cluster else None
            root = Path(scratch, name.strip("]").replace("[", "-"))
            return run_master(name, master, args, logs, url, redis_url, root, skip or frozenset())
        finally:
            if cluster is not None:
                cluster.stop()


def report(results: list[Result], memory: str) -> None:
    import pyspark

    print(
        f"\nPySpark {pyspark.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} cores (shared: timings are noisy), driver memory {memory}; "
        "standalone = 2 workers of 1 core, executors 1g; warm: after a 50k-event run"
    )
    head = (
        f"{'master':>10} {'events':>10} {'audit s':>8} {'ev/s':>8} {'copy ev/s':>10} {'ratio':>6}"
    )
    print(f"{head} {'driver RSS':>11} {'anon':>8}\n{'-' * (len(head) + 21)}")
    rates = {(r.master, r.events): r.events / r.audit_s for r in results}
    for r in results:
        rate, baseline = r.events / r.audit_s, r.events / r.copy_s
        print(f"{r.master:>10} {r.events:>10,} {r.audit_s:>8.1f} {rate:>8,.0f} {baseline:>10,.0f} "
              f"{rate / baseline:>6.2f} {r.rss_mb:>8,.0f} MB {r.anon_mb:>5,.0f} MB")  # fmt: skip
    big = max((r.events for r in results), default=0)
    if ("local[2]", big) in rates:
        goal(f"local[2] events/s at {big:,}", rates["local[2]", big], ">=", 100_000)
    if ("local[2]", big) in rates and ("standalone", big) in rates:
        ratio = rates["standalone", big] / rates["local[2]", big]
        goal(f"standalone / local[2] at {big:,}", ratio, ">=", 0.8)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        sys.exit(1)
