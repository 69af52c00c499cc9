"""Audit benchmark: events audited per second by `rig-conductor audit`, on local[2] and on a
Spark standalone cluster of two one-core workers (started from the pyspark wheel), each against
a plain JDBC -> Parquet copy of the same rows on the same session as the baseline.

    .venv/bin/python bench/audit.py                 # 1M and 5M events, both masters
    .venv/bin/python bench/audit.py --quick         # 200k events
    .venv/bin/python bench/audit.py --sizes 2000000 --masters local[2] --driver-memory 2g

PostgreSQL: RIG_BENCH_DATABASE_URL, default postgresql+psycopg://postgres@127.0.0.1:5432/
rig_bench_audit (created if missing, migrated to head). Each size is a tenant of its own
(`bench-<size>`), generated server-side with generate_series and kept for later runs.
Redis: RIG_BENCH_REDIS_URL, default redis://127.0.0.1:6379/14, only read (the bench streams are
not there, so nothing is pending). See bench/README.md for what the numbers mean.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from pyspark.sql import SparkSession

from common import conninfo, ensure_database
from rig_conductor.adapters.postgres import migrations
from rig_conductor.audit import job, session, sources
from rig_conductor.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.spark.cluster import SparkCluster

DEFAULT_DATABASE = "postgresql+psycopg://postgres@127.0.0.1:5432/rig_bench_audit"
DEFAULT_REDIS = "redis://127.0.0.1:6379/14"
GENERATED_FROM = datetime(2025, 1, 1, tzinfo=UTC)
GENERATOR = "v1"  # bump when the generated log changes: stored datasets are rebuilt
WARMUP_EVENTS = 50_000
# Per 1,000 entries (r = entry % 1000): 5 never started, 5 started and never finished (both
# lost: the bench streams are not in Redis), 5 dead-lettered, 20 reclaimed with the old owner
# reporting after the new attempt started (duplicates), 5 completed twice by two consumers, the
# rest started and completed; every 4th entry brings a heartbeat, with one agent silent for a
# stretch in the middle (down time).
EVENTS_PER_1000_ENTRIES = 5 * 1 + 5 * 2 + 5 * 3 + 20 * 6 + 5 * 4 + 960 * 3 + 250

GENERATE = """
INSERT INTO events (tenant, occurred_at, kind, agent_id, consumer, stream, group_name, entry_id,
                    issue_id, attempt, fenced, detail)
SELECT %(tenant)s,
       t,
       CASE k WHEN 0 THEN 'ISSUE_ASSIGNED' WHEN 1 THEN 'WORK_STARTED' WHEN 2 THEN 'RECLAIMED'
              WHEN 3 THEN 'WORK_STARTED' WHEN 4 THEN 'WORK_COMPLETED' WHEN 5 THEN 'WORK_COMPLETED'
              WHEN 6 THEN 'DEAD_LETTERED' ELSE 'HEARTBEAT' END,
       CASE WHEN k = 7 THEN 'agent-' || (i / 4 %% 50)
            WHEN k IN (3, 5) AND reclaimed THEN 'agent-' || ((i + 1) %% 50)
            WHEN k = 4 AND NOT reclaimed THEN 'agent-' || ((i + 2) %% 50)
            ELSE 'agent-' || (i %% 50) END,
       CASE WHEN k = 7 THEN 'agent-' || (i / 4 %% 50) || '-0'
            WHEN k IN (3, 5) AND reclaimed THEN 'agent-' || ((i + 1) %% 50) || '-0'
            WHEN k = 4 AND NOT reclaimed THEN 'agent-' || ((i + 2) %% 50) || '-0'
            WHEN k = 0 THEN NULL
            ELSE 'agent-' || (i %% 50) || '-0' END,
       CASE WHEN k = 7 THEN NULL ELSE 'bench:s' || (i %% 4) END,
       CASE WHEN k IN (2, 6) THEN 'g' END,
       CASE WHEN k = 7 THEN NULL ELSE (1700000000000 + i) || '-0' END,
       CASE WHEN k IN (0, 6) THEN 'rc-' || i END,
       CASE WHEN k IN (1, 4) AND reclaimed THEN 1 WHEN k IN (3, 5) AND reclaimed THEN 2
            WHEN k IN (1, 5) THEN 1 END,
       k = 4 AND reclaimed,
       CASE WHEN k = 2 THEN jsonb_build_object(
                'toConsumer', 'agent-' || ((i + 1) %% 50) || '-0',
                'toAgent', 'agent-' || ((i + 1) %% 50),
                'reasons', jsonb_build_array('agent-heartbeat-stale'),
                'lastHeartbeatAt', to_char((t - (600 + i %% 300) * interval '1 second')
                    AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                'idleMs', 300000 + i %% 1000, 'deliveries', 1)
            WHEN k = 6 THEN jsonb_build_object('deliveries', 5, 'reason', 'max-deliveries',
                'dlqId', (1700000000000 + i) || '-1')
            ELSE '{}'::jsonb END
  FROM generate_series(1, %(entries)s) AS i,
       LATERAL (SELECT i %% 1000 AS r) AS c,
       LATERAL (SELECT r >= 15 AND r < 35 AS reclaimed) AS f,
       generate_series(0, 7) AS k,
       LATERAL (SELECT TIMESTAMPTZ '2025-01-01 00:00:00+00' + i * interval '100 ms'
                       + k * interval '10 ms' AS t) AS ts
 WHERE CASE k
         WHEN 0 THEN true
         WHEN 1 THEN r >= 5
         WHEN 2 THEN reclaimed
         WHEN 3 THEN reclaimed
         WHEN 4 THEN reclaimed OR (r >= 35 AND r < 40)
         WHEN 5 THEN r >= 15
         WHEN 6 THEN r >= 10 AND r < 15
         ELSE i %% 4 = 0 AND NOT (i / 4 %% 50 = 7 AND i BETWEEN %(quiet_from)s AND %(quiet_to)s)
       END
 ORDER BY i, k
"""


def ensure_dataset(url: str, events: int) -> tuple[str, int, float]:
    """The tenant holding about `events` generated events: (tenant, rows, seconds to build).

    Event times start at GENERATED_FROM, 100 ms per entry: `data_end` gives the window's end.
    """
    tenant = f"bench-{events}"
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_audit_datasets "
            "(tenant text PRIMARY KEY, generator text NOT NULL, events bigint NOT NULL)"
        )
        found = conn.execute(
            "SELECT events FROM bench_audit_datasets WHERE tenant = %s AND generator = %s",
            (tenant, GENERATOR),
        ).fetchone()
        if found is not None:
            return tenant, int(found[0]), 0.0
        started = time.perf_counter()
        conn.execute("DELETE FROM events WHERE tenant = %s", (tenant,))
        entries = round(events * 1000 / EVENTS_PER_1000_ENTRIES)
        quiet = (entries // 2, entries // 2 + 20_000)  # agent-7 silent for ~2,000 s
        params = {
            "tenant": tenant,
            "entries": entries,
            "quiet_from": quiet[0],
            "quiet_to": quiet[1],
        }
        with conn.transaction():
            conn.execute(GENERATE, params)
        conn.execute("ANALYZE events")
        rows = conn.execute("SELECT count(*) FROM events WHERE tenant = %s", (tenant,)).fetchone()
        assert rows is not None
        conn.execute(
            "INSERT INTO bench_audit_datasets VALUES (%s, %s, %s) "
            "ON CONFLICT (tenant) DO UPDATE SET generator = excluded.generator, "
            "events = excluded.events",
            (tenant, GENERATOR, rows[0]),
        )
        return tenant, int(rows[0]), time.perf_counter() - started


def expected_findings(events: int) -> dict[str, int]:
    """What the generator planted in the dataset of `events` (see the mix above)."""
    entries = round(events * 1000 / EVENTS_PER_1000_ENTRIES)
    counts = {"dispatched": entries, "lost": 0, "deadLettered": 0, "duplicates": 0, "reclaims": 0}
    for i in range(1, entries + 1):
        r = i % 1000
        counts["lost"] += r < 10
        counts["deadLettered"] += 10 <= r < 15
        counts["duplicates"] += 15 <= r < 40
        counts["reclaims"] += 15 <= r < 35
    return counts


@dataclass
class Result:
    events: int
    partitions: int
    read_s: float
    compute_s: float
    write_s: float
    dispatched: int
    lost: int
    duplicates: int
    reclaims: int
    dead_lettered: int
    master: str = "local[2]"
    copy_s: float = 0.0  # the JDBC -> Parquet baseline on the same rows

    def findings(self) -> dict[str, int]:
        return {
            "dispatched": self.dispatched,
            "lost": self.lost,
            "deadLettered": self.dead_lettered,
            "duplicates": self.duplicates,
            "reclaims": self.reclaims,
        }

    @property
    def total_s(self) -> float:
        return self.read_s + self.compute_s + self.write_s


def data_end(events: int) -> datetime:
    """Just after the last generated event: the audit window ends there, as of that time."""
    entries = round(events * 1000 / EVENTS_PER_1000_ENTRIES)
    return GENERATED_FROM + timedelta(milliseconds=100 * entries + 1_000)


def audit_once(
    spark: SparkSession,
    url: str,
    redis_url: str,
    tenant: str,
    until: datetime,
    out: Path,
    parts: int | None,
) -> Result:
    settings = Settings(database_url=url, redis_url=redis_url, tenant=tenant)
    options = session.AuditOptions(output=out, until=until, partitions=parts)
    source = sources.jdbc_source(settings.sqlalchemy_url)
    timings: dict[str, int] = {}
    summary = job.run(
        spark,
        settings=settings,
        options=options,
        source=source,
        timings=timings,
    )
    return Result(
        events=summary["events"],
        partitions=summary["jdbcPartitions"],
        read_s=timings["readMs"] / 1000,
        compute_s=(timings["computeMs"] + timings["redisMs"]) / 1000,
        write_s=timings["writeMs"] / 1000,
        dispatched=summary["dispatched"],
        lost=len(summary["lost"]),
        duplicates=len(summary["duplicates"]),
        reclaims=summary["reclaims"],
        dead_lettered=summary["deadLettered"],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one run at 200k events")
    parser.add_argument("--sizes", help="comma list of event counts (default 1000000,5000000)")
    parser.add_argument("--partitions", type=int, help="JDBC read partitions (default: automatic)")
    parser.add_argument("--driver-memory", default="2g", help="spark.driver.memory (default 2g)")
    parser.add_argument("--no-warmup", action="store_true", help="skip the 50k-event warm-up run")
    parser.add_argument("--keep", type=Path, help="write the audit outputs here and keep them")
    parser.add_argument(
        "--masters", default="local[2],standalone", help="local[2] and/or standalone (2 workers)"
    )
    args = parser.parse_args(argv)
    sizes = [200_000] if args.quick else [1_000_000, 5_000_000]
    if args.sizes:
        sizes = [int(s.replace("_", "")) for s in args.sizes.split(",")]
    url = os.environ.get("RIG_BENCH_DATABASE_URL", DEFAULT_DATABASE)
    redis_url = os.environ.get("RIG_BENCH_REDIS_URL", DEFAULT_REDIS)
    jar = Path(os.environ.get(session.JDBC_JAR_ENV) or session.DEFAULT_JDBC_JAR)
    if not jar.is_file():
        print(
            f"bench/audit.py: no JDBC driver at {jar} (set {session.JDBC_JAR_ENV})", file=sys.stderr
        )
        return 2

    ensure_database(url)
    migrations.upgrade(url)
    datasets = []
    for size in ([WARMUP_EVENTS] if not args.no_warmup else []) + sizes:
        tenant, rows, built = ensure_dataset(url, size)
        note = f"generated in {built:.1f} s" if built else "reused"
        print(f"dataset {tenant}: {rows:,} events ({note})", flush=True)
        datasets.append((size, tenant))

    results: list[Result] = []
    spark_starts: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="rig-bench-audit-") as scratch:
        root = args.keep or Path(scratch)
        for master in args.masters.split(","):
            cluster = None
            if master == "standalone":
                cluster = SparkCluster(root / "spark").start()
            try:
                found, started = run_master(
                    args, master, cluster.url if cluster else master, jar, url, redis_url,
                    datasets, root / master.replace("[", "").replace("]", ""),
                )  # fmt: skip
            finally:
                if cluster is not None:
                    cluster.stop()
            if found is None:
                return 1
            results += found
            spark_starts[master] = started
    report(results, spark_starts, args.driver_memory, url)
    return 0


def run_master(
    args: argparse.Namespace,
    name: str,
    master: str,
    jar: Path,
    url: str,
    redis_url: str,
    datasets: list[tuple[int, str]],
    root: Path,
) -> tuple[list[Result] | None, float]:
    """Every dataset audited on one master, warm-up first; None when a finding is off."""
    options = session.AuditOptions(
        output=Path("."),
        master=master,
        conf=(
            ("spark.driver.memory", args.driver_memory),
            ("spark.executor.memory", "1g"),
            ("spark.ui.enabled", "false"),
        ),
        jdbc_jar=jar,
    )
    started = time.perf_counter()
    spark, _ = session.spark_session(options)
    spark_start = time.perf_counter() - started
    results: list[Result] = []
    try:
        for size, tenant in datasets:
            until = data_end(size)
            result = audit_once(
                spark, url, redis_url, tenant, until, root / tenant, args.partitions
            )
            result.master = name
            if size == WARMUP_EVENTS and not args.no_warmup:
                print(f"{name} warm-up: {result.events:,} events in {result.total_s:.1f} s")
                continue
            planted = expected_findings(size)
            if result.findings() != planted:
                print(
                    f"bench/audit.py: {tenant} on {name}: found {result.findings()}, "
                    f"planted {planted}",
                    file=sys.stderr,
                )
                return None, spark_start
            result.copy_s = copy_once(
                spark, url, tenant, root / f"{tenant}-copy", result.partitions
            )
            results.append(result)
            print(
                f"{name}: audited {result.events:,} events in {result.total_s:.1f} s (findings "
                f"match what was planted); JDBC -> Parquet copy {result.copy_s:.1f} s",
                flush=True,
            )
    finally:
        spark.stop()
    return results, spark_start


def copy_once(spark: SparkSession, url: str, tenant: str, out: Path, partitions: int) -> float:
    """The baseline: the tenant's events read over JDBC in as many partitions, written as
    Parquet, nothing else; seconds."""
    source = sources.jdbc_source(url)
    with psycopg.connect(conninfo(url)) as conn:
        low, high = conn.execute(
            "SELECT min(id), max(id) FROM events WHERE tenant = %s", (tenant,)
        ).fetchone() or (0, 0)
    started = time.perf_counter()
    table = f"(SELECT * FROM events WHERE tenant = '{tenant}') AS audited"
    reader = spark.read.format("jdbc").options(**source.options(), dbtable=table)
    if partitions > 1 and low is not None:
        reader = reader.options(
            partitionColumn="id",
            lowerBound=str(low),
            upperBound=str(high),
            numPartitions=str(partitions),
        )
    reader.load().write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def report(results: list[Result], spark_start: dict[str, float], memory: str, url: str) -> None:
    import pyspark

    with psycopg.connect(conninfo(url)) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    print()
    print(
        f"PySpark {pyspark.__version__}, driver memory {memory}; PostgreSQL "
        f"{version[0] if version else '?'}; Python {platform.python_version()}; "
        f"{os.cpu_count()} cores; standalone = 2 workers of 1 core, executors 1g"
    )
    starts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in spark_start.items())
    print(f"Spark start-up (once per master, not in the rows below): {starts}")
    print()
    header = (
        f"{'master':>10} {'events':>11} {'read s':>7} {'compute s':>9} {'write s':>7} "
        f"{'total s':>7} {'ev/s':>9} {'copy ev/s':>9} {'ratio':>5}  findings"
    )
    print(header)
    print("-" * len(header))
    local = {r.events: r for r in results if r.master.startswith("local")}
    for r in results:
        rate, copy = r.events / r.total_s, r.events / r.copy_s
        versus = ""
        if not r.master.startswith("local") and r.events in local:
            versus = f", {rate / (local[r.events].events / local[r.events].total_s):.2f}x local"
        print(
            f"{r.master:>10} {r.events:>11,} {r.read_s:>7.1f} {r.compute_s:>9.1f} "
            f"{r.write_s:>7.1f} {r.total_s:>7.1f} {rate:>9,.0f} {copy:>9,.0f} "
            f"{rate / copy:>5.2f}  {r.dispatched:,} dispatched, {r.lost:,} lost, "
            f"{r.duplicates:,} duplicates, {r.reclaims:,} reclaims{versus}"
        )
    print("goal: >= 100,000 events/s end to end at 5M on local[2]; standalone >= 0.8 of it")


if __name__ == "__main__":
    sys.exit(main())
