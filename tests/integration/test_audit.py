"""The audit end to end: an event log built through the real code paths (dispatch, WORK_*
reports, a real reaper scan, runtime dead letters, requeues) on a real PostgreSQL and Redis,
with planted anomalies, then the real `main` on a local[2] Spark. Every planted finding must be
found and nothing else (precision and recall 1.0)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.audit_conftest import require_pyspark

require_pyspark()

from redis.asyncio import Redis  # noqa: E402
from sqlalchemy import text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: E402

from rig_conductor.adapters.postgres import audits, intake, queries, work  # noqa: E402
from rig_conductor.adapters.postgres import dispatches as dispatch_rows  # noqa: E402
from rig_conductor.adapters.postgres import writes as pg_writes  # noqa: E402
from rig_conductor.adapters.redis import writes as redis_writes  # noqa: E402
from rig_conductor.audit import main as audit_main  # noqa: E402
from rig_conductor.domain import (  # noqa: E402
    AgentId,
    ConsumerName,
    EntryId,
    GroupName,
    PendingEntry,
    StreamKey,
)
from rig_conductor.metrics import Metrics  # noqa: E402
from rig_conductor.reaper import cycle  # noqa: E402
from rig_conductor.settings import Settings  # noqa: E402
from tests.audit_conftest import jdbc_ready_fixture, spark_fixture  # noqa: E402, F401

from .helpers import port, read  # noqa: E402

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

S, S2, S3 = "rig:dispatch", "assignments:ops", "assignments:new"
G = "workers"
TENANT = "default"
DOWN_MS_FOR_THE_REAPER = 1_500
SYNTHETIC_LATENCIES_MS = (10_000, 250_000)
HB_X_BEATS_MIN_AGO = (100, 90, 60, 55, 45, 35, 25, 15, 5)  # one gap of 30 min, the rest <= 10


def agent_of(consumer: str) -> str:
    return consumer.rsplit("-", 1)[0]


class World:
    """Drives the real code paths and remembers what was planted."""

    def __init__(self, redis: Redis, engine: AsyncEngine) -> None:
        self.redis, self.engine = redis, engine
        self.entries: dict[str, tuple[str, str]] = {}  # label -> (stream, entry id)

    async def dispatch(self, label: str, issue: str, *, stream: str = S) -> str:
        """What `POST /api/events` ISSUE_ASSIGNED does: append once, then record it."""
        fields = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "dev-e", "payload": "{}"}
        entry, appended = await redis_writes.append_once(
            self.redis, stream=StreamKey(stream), key=label, fields=fields, remember_s=86_400
        )
        assert appended
        await dispatch_rows.record_dispatch(
            self.engine,
            tenant=TENANT,
            key=label,
            issue_id=issue,
            agent_id="dev-e",
            stream=stream,
            entry_id=entry,
        )
        self.entries[label] = (stream, entry)
        return entry

    async def read(self, label: str, consumer: str) -> None:
        stream, entry = self.entries[label]
        assert await read(self.redis, stream, G, consumer, 1) == [entry]

    async def report(
        self, kind: Any, label: str, consumer: str, attempt: int | None = None
    ) -> work.WorkOutcome:
        stream, entry = self.entries[label]
        return await work.record_work(
            self.engine,
            tenant=TENANT,
            report=work.WorkReport(
                kind, agent_of(consumer), stream, entry, consumer=consumer, attempt=attempt, group=G
            ),
        )

    async def complete(self, label: str, consumer: str, *, ack: bool = True) -> None:
        started = await self.report("WORK_STARTED", label, consumer)
        done = await self.report("WORK_COMPLETED", label, consumer, started.attempt)
        assert done.accepted
        if ack:
            await self.ack(label)

    async def log_completion(self, label: str, consumer: str, attempt: int) -> None:
        """An accepted WORK_COMPLETED in the event log that the conductor would refuse today (a
        consumer that never owned the attempt): an older log, or a database written by hand.
        The audit reads the log as it is, so it must still find what this plants."""
        stream, entry = self.entries[label]
        row = queries.EventRow(
            "WORK_COMPLETED", agent_of(consumer), consumer, stream, G, entry, attempt=attempt
        )
        await pg_writes.append_events(self.engine, tenant=TENANT, rows=[row])

    async def ack(self, label: str) -> None:
        stream, entry = self.entries[label]
        await self.redis.xack(stream, G, entry)

    async def wear_out(self, label: str, consumer: str, deliveries: int) -> None:
        stream, entry = self.entries[label]
        await self.redis.xclaim(stream, G, consumer, 0, [entry], retrycount=deliveries, justid=True)

    async def runtime_dead_letter(self, label: str, consumer: str, deliveries: int) -> str:
        """What the agent runtime does with a worn-out entry: straight to the DLQ, no event."""
        stream, entry = self.entries[label]
        done = await redis_writes.dead_letter(
            self.redis,
            stream=StreamKey(stream),
            group=GroupName(G),
            entries=[PendingEntry(EntryId(entry), ConsumerName(consumer), 0, deliveries)],
            reason="max-deliveries",
        )
        assert len(done) == 1
        return done[0].dlq_id

    async def requeue(self, label: str, dlq_id: str, new_label: str) -> None:
        """What `POST /api/deadletters/requeue` does."""
        stream, _ = self.entries[label]
        moved = await redis_writes.requeue(self.redis, stream=StreamKey(stream), dlq_id=dlq_id)
        assert moved is not None
        entry, issue = moved
        await pg_writes.append_events(
            self.engine,
            tenant=TENANT,
            rows=[
                queries.EventRow(
                    "DEAD_LETTER_REQUEUED",
                    stream=stream,
                    entry_id=entry,
                    issue_id=issue,
                    detail=json.dumps({"dlqId": dlq_id}),
                )
            ],
        )
        self.entries[new_label] = (stream, entry)

    async def heartbeat(self, *consumers: str) -> None:
        await intake.record_heartbeats(
            self.engine,
            tenant=TENANT,
            heartbeats=[
                intake.HeartbeatIn(AgentId(agent_of(c)), ConsumerName(c)) for c in consumers
            ],
        )

    async def db_now(self) -> datetime:
        async with self.engine.connect() as conn:
            now: datetime = (await conn.execute(text("SELECT now()"))).scalar_one()
        return now

    async def pinned(self, rows: Sequence[tuple[queries.EventRow, datetime]]) -> None:
        """Append rows, then pin their times (COPY stamps now()): known latencies and gaps."""
        async with self.engine.connect() as conn:
            before = (await conn.execute(text("SELECT coalesce(max(id), 0) FROM events"))).scalar()
        await pg_writes.append_events(self.engine, tenant=TENANT, rows=[row for row, _ in rows])
        async with self.engine.begin() as conn:
            for offset, (_, when) in enumerate(rows, start=1):
                await conn.execute(
                    text("UPDATE events SET occurred_at = :at WHERE id = :id"),
                    {"at": when, "id": int(before or 0) + offset},
                )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default, Spark's `percentile`)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def build(world: World, make_settings: Callable[..., Settings]) -> dict[str, Any]:
    """The planted log. Returns what the audit must find."""
    redis = world.redis
    for stream in (S, S2):
        await redis.xgroup_create(stream, G, id="0", mkstream=True)
    await world.heartbeat("ops-e-0")  # ops-e's only heartbeat: it dies after this

    for label in ("rc-1", "rc-2", "rc-3"):  # completed
        await world.dispatch(label, label)
        await world.read(label, "dev-e-0")
        await world.complete(label, "dev-e-0")
    await world.report("WORK_COMPLETED", "rc-2", "dev-e-0", 1)  # a retried report: no duplicate

    await world.dispatch("rc-4", "rc-4")  # lost: started, then acked without a completion
    await world.read("rc-4", "dev-e-0")
    await world.report("WORK_STARTED", "rc-4", "dev-e-0")
    await world.ack("rc-4")
    await world.dispatch("rc-5", "rc-5")  # lost: acked, never started
    await world.read("rc-5", "dev-e-0")
    await world.ack("rc-5")
    entry6 = await world.dispatch("rc-6", "rc-6")  # lost: deleted before anyone read it
    await redis.xdel(S, entry6)

    await world.dispatch("rc-7", "rc-7")  # pending in qa-e-0's PEL
    await world.read("rc-7", "qa-e-0")
    await world.report("WORK_STARTED", "rc-7", "qa-e-0")
    await world.dispatch("rc-8", "rc-8")  # pending after a failure
    await world.read("rc-8", "dev-e-0")
    failed = await world.report("WORK_STARTED", "rc-8", "dev-e-0")
    await world.report("WORK_FAILED", "rc-8", "dev-e-0", failed.attempt)

    for label in ("rc-12", "rc-13", "rc-19"):  # held by ops-e-0, which dies: reclaimed
        await world.dispatch(label, label)
        await world.read(label, "ops-e-0")
    await world.report("WORK_STARTED", "rc-12", "ops-e-0")
    await world.report("WORK_STARTED", "rc-19", "ops-e-0")

    await world.dispatch("rc-14", "rc-14")  # worn out at zed-e-0: the reaper dead-letters it
    await world.read("rc-14", "zed-e-0")
    await world.wear_out("rc-14", "zed-e-0", 3)

    await world.dispatch("rc-15", "rc-15")  # worn out at qa-e-0: the runtime dead-letters it
    await world.read("rc-15", "qa-e-0")
    await world.wear_out("rc-15", "qa-e-0", 3)
    await world.runtime_dead_letter("rc-15", "qa-e-0", 3)

    await world.dispatch("rc-16", "rc-16")  # completed by dev-e-0, then again by qa-e-0
    await world.read("rc-16", "dev-e-0")
    await world.complete("rc-16", "dev-e-0")
    await world.log_completion("rc-16", "qa-e-0", attempt=1)

    await world.dispatch("rc-17-a", "rc-17")  # one issue dispatched twice, done by two
    await world.read("rc-17-a", "dev-e-0")
    await world.complete("rc-17-a", "dev-e-0")
    await world.dispatch("rc-17-b", "rc-17")
    await world.read("rc-17-b", "qa-e-0")
    await world.complete("rc-17-b", "qa-e-0")

    await world.dispatch("rc-20", "rc-20")  # runtime dead letter, requeued, then completed
    await world.read("rc-20", "dev-e-0")
    await world.wear_out("rc-20", "dev-e-0", 3)
    letter = await world.runtime_dead_letter("rc-20", "dev-e-0", 3)
    await world.requeue("rc-20", letter, "rc-20-requeued")
    await world.read("rc-20-requeued", "dev-e-0")
    await world.complete("rc-20-requeued", "dev-e-0")

    await world.dispatch("rc-30", "rc-30", stream=S2)  # another stream: one done, one lost
    await world.read("rc-30", "qa-e-0")
    await world.complete("rc-30", "qa-e-0")
    await world.dispatch("rc-31", "rc-31", stream=S2)
    await world.read("rc-31", "qa-e-0")
    await world.ack("rc-31")
    await world.dispatch("rc-32", "rc-32", stream=S3)  # a stream nobody reads yet: pending

    # ops-e goes quiet past the reaper's threshold; the live agents beat just before the scan.
    await asyncio.sleep(DOWN_MS_FOR_THE_REAPER / 1000 + 0.3)
    await world.heartbeat("qa-e-0")
    await world.heartbeat("dev-e-0")
    reaper = make_settings(
        streams=(S, "assignments:*"),
        dispatch_stream=S,
        agent_ids=("dev-e", "qa-e", "ops-e", "zed-e"),
        entry_stale_ms=0,
        agent_down_ms=DOWN_MS_FOR_THE_REAPER,
        max_deliveries=3,
    )
    scan = await cycle.reap_once(
        redis=redis, engine=world.engine, settings=reaper, effects=port(world.engine, reaper)
    )
    assert (scan.reclaimed, scan.dead_lettered) == (3, 1), scan.model_dump(by_alias=True)
    owners = await redis.xpending_range(S, G, min="-", max="+", count=100)
    target = next(r["consumer"] for r in owners if r["message_id"] == world.entries["rc-12"][1])
    assert target in ("dev-e-0", "qa-e-0")

    # rc-12: the new attempt starts, then the zombie reports: duplicate work, fenced.
    assert (await world.report("WORK_STARTED", "rc-12", target)).attempt == 2
    zombie = await world.report("WORK_COMPLETED", "rc-12", "ops-e-0", 1)
    assert not zombie.accepted
    await world.report("WORK_COMPLETED", "rc-12", target, 2)
    await world.ack("rc-12")
    await world.complete("rc-13", target)  # the zombie never reported: no duplicate
    # rc-19: the zombie's completion is fenced before anyone restarted it: stays pending.
    assert not (await world.report("WORK_COMPLETED", "rc-19", "ops-e-0", 1)).accepted

    letters = await redis.xrange(f"{S}:dlq")
    reaped = next(i for i, f in letters if f["originalId"] == world.entries["rc-14"][1])
    await world.requeue("rc-14", reaped, "rc-14-requeued")  # left unread: pending
    await world.dispatch("rc-9", "rc-9")  # never read: pending
    await world.dispatch("rc-10", "rc-10")

    now = await world.db_now()
    synthetic = [
        (
            queries.EventRow(
                "RECLAIMED",
                agent_id="ops-e",
                consumer="ops-e-0",
                stream=S,
                group_name=G,
                entry_id=world.entries[label][1],
                detail=json.dumps(
                    {
                        "toConsumer": "dev-e-0",
                        "toAgent": "dev-e",
                        "lastHeartbeatAt": (now - timedelta(milliseconds=ms)).isoformat(),
                        "idleMs": ms,
                        "deliveries": 1,
                    }
                ),
            ),
            now,
        )
        for label, ms in zip(("rc-1", "rc-2"), SYNTHETIC_LATENCIES_MS, strict=True)
    ]
    beats = [
        (
            queries.EventRow("HEARTBEAT", agent_id="hb-x", consumer="hb-x-0"),
            now - timedelta(minutes=m),
        )
        for m in HB_X_BEATS_MIN_AGO
    ]
    await world.pinned([*synthetic, *beats])
    return {"target": target, "latencies": await reclaim_latencies(world.engine)}


async def reclaim_latencies(engine: AsyncEngine) -> list[float]:
    """Every reclaimed entry's latency as the log records it (batches unrolled)."""
    query = text(
        "SELECT occurred_at, detail->>'lastHeartbeatAt' AS beat, "
        "coalesce(cardinality(entry_ids), 1) AS n FROM events WHERE kind = 'RECLAIMED'"
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    latencies: list[float] = []
    for occurred_at, beat, n in rows:
        latency = (occurred_at - datetime.fromisoformat(beat)).total_seconds() * 1000
        latencies.extend([latency] * n)
    return latencies


def audit_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    audit_main.configure_parser(parser)
    return parser.parse_args(list(argv))


@pytest.mark.timeout(900)
async def test_the_audit_finds_exactly_what_was_planted(
    jdbc_ready: str,  # first: a skip needs no JVM
    spark: SparkSession,
    redis: Redis,
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    world = World(redis, engine)
    planted = await build(world, make_settings)
    target = planted["target"]
    out = tmp_path / "audit"
    settings = make_settings(streams=(S, "assignments:*"), dispatch_stream=S)

    exit_code = await asyncio.to_thread(
        audit_main.main, audit_args("--output", str(out), "--partitions", "3"), settings
    )

    assert exit_code == 0
    summary = json.loads((out / "summary.json").read_text())
    entry = world.entries
    assert {
        k: summary[k] for k in ("dispatched", "completed", "deadLettered", "pending", "reclaims")
    } == {"dispatched": 24, "completed": 10, "deadLettered": 3, "pending": 7, "reclaims": 5}
    # The reaper's 3 moves, and 2 rows written the way the log was before reasons existed.
    assert summary["reclaimsByReason"] == {"down": 5}
    assert summary["lost"] == [
        {"stream": S2, "entryId": entry["rc-31"][1], "issueId": "rc-31"},
        {"stream": S, "entryId": entry["rc-4"][1], "issueId": "rc-4"},
        {"stream": S, "entryId": entry["rc-5"][1], "issueId": "rc-5"},
        {"stream": S, "entryId": entry["rc-6"][1], "issueId": "rc-6"},
    ]
    assert summary["duplicates"] == [
        {"issueId": "rc-12", "consumers": sorted([target, "ops-e-0"])},
        {"issueId": "rc-16", "consumers": ["dev-e-0", "qa-e-0"]},
        {"issueId": "rc-17", "consumers": ["dev-e-0", "qa-e-0"]},
    ]
    latencies = planted["latencies"]
    assert len(latencies) == 5
    expected = {
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies),
    }
    for key, value in expected.items():
        assert abs(summary["reclaimLatencyMs"][key] - value) <= 1, (key, summary, latencies)
    assert summary["reclaimLatencyMs"]["max"] == pytest.approx(250_000, abs=1)
    assert (summary["pendingInPel"], summary["pendingUndelivered"]) == (3, 4)
    assert (summary["requeued"], summary["deadLetteredOutsideLog"]) == (2, 2)
    assert summary["events"] > 0 and summary["redis"]["deadLetters"] == 1  # rc-15's letter

    agents = {a["agentId"]: a for a in summary["agents"]}
    assert (agents["hb-x"]["downMs"], agents["hb-x"]["downPeriods"]) == (1_800_000, 1)
    assert 0.70 <= agents["hb-x"]["availability"] < 0.71  # 1 - 30 min / (100 min + the run)
    assert agents["dev-e"]["downPeriods"] == 0
    rates = {r["stream"]: r for r in summary["deadLetterRate"]}
    assert (rates[S]["dispatched"], rates[S]["deadLettered"]) == (21, 3)
    assert (rates[S2]["rate"], rates[S3]["rate"]) == (0.0, 0.0)

    tables = summary["tables"]
    assert {"entries", "lost", "duplicates", "reclaims", "availability", "dead_letter_rate"} <= set(
        tables
    )
    for name in tables:
        assert list((out / name).glob("*.parquet")), name
    lost = spark.read.parquet(str(out / "lost")).collect()
    assert sorted(r["issue_id"] for r in lost) == ["rc-31", "rc-4", "rc-5", "rc-6"]
    statuses = spark.read.parquet(str(out / "entries")).groupBy("status").count().collect()
    assert {r["status"]: r["count"] for r in statuses} == {
        "completed": 10,
        "dead_lettered": 3,
        "pending": 7,
        "lost": 4,
    }
    assert spark.read.parquet(str(out / "reclaims")).count() == 5
    duplicates = spark.read.parquet(str(out / "duplicates")).collect()
    assert {r["issue_id"]: r["reasons"] for r in duplicates} == {
        "rc-12": ["overlapping-attempts"],
        "rc-16": ["completed-by-several-consumers"],
        "rc-17": ["completed-by-several-consumers"],
    }

    # The verdict reaches PostgreSQL, and from there the conductor's rig_audit_* gauges.
    verdict = await audits.last_audit(engine, tenant=TENANT)
    assert verdict is not None
    assert (verdict.dispatched, verdict.lost, verdict.duplicates) == (24, 4, 3)
    metrics = Metrics()
    assert metrics.registry.get_sample_value("rig_audit_lost_entries") == 0  # exposed from start
    await cycle.reap_once(
        redis=redis,
        engine=engine,
        settings=settings,
        metrics=metrics,
        effects=port(engine, settings, metrics=metrics),
    )
    assert metrics.registry.get_sample_value("rig_audit_lost_entries") == 4
    assert metrics.registry.get_sample_value("rig_audit_duplicate_issues") == 3
    finished = metrics.registry.get_sample_value("rig_audit_last_finished_timestamp_seconds")
    assert finished == verdict.finished_at.timestamp()

    page = (out / "report.html").read_text()
    images = re.findall(r"<img src='([^']+)'", page)
    assert sorted(images) == ["availability.png", "pending_over_time.png", "reclaim_latency.png"]
    for image in images:
        assert (out / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(450)
async def test_a_window_with_no_events_writes_an_empty_audit(
    jdbc_ready: str,  # first: a skip needs no JVM
    spark: SparkSession,
    redis: Redis,
    engine: AsyncEngine,
    make_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    world = World(redis, engine)
    await world.dispatch("rc-1", "rc-1")  # before the window: not audited
    out = tmp_path / "empty"
    args = audit_args("--output", str(out), "--until", "2000-01-01T00:00:00Z")

    assert await asyncio.to_thread(audit_main.main, args, make_settings()) == 0

    summary = json.loads((out / "summary.json").read_text())
    assert {k: summary[k] for k in ("dispatched", "pending", "lost", "duplicates", "reclaims")} == {
        "dispatched": 0,
        "pending": 0,
        "lost": [],
        "duplicates": [],
        "reclaims": 0,
    }
    assert summary["reclaimLatencyMs"] == {"p50": 0, "p95": 0, "max": 0}
    assert summary["window"]["until"] == "2000-01-01T00:00:00+00:00"
    assert (out / "report.html").exists() and (out / "reclaim_latency.png").exists()


def run_cli(tmp_path: Path, output: str = "out", **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "rig_conductor.audit", "--output", str(tmp_path / output)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_missing_jdbc_jar_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = run_cli(tmp_path, RIG_JDBC_JAR=str(tmp_path / "nowhere.jar"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "RIG_JDBC_JAR" in lines[0] and "nowhere.jar" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_unix_socket_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    jar = tmp_path / "postgresql.jar"
    jar.write_bytes(b"")  # only its presence is checked before Spark starts
    done = run_cli(
        tmp_path,
        RIG_JDBC_JAR=str(jar),
        RIG_DATABASE_URL="postgresql+psycopg://postgres@/rig?host=/run/postgresql",
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "RIG_DATABASE_URL" in lines[0] and "TCP" in lines[0], done.stderr


def test_an_output_path_spark_would_take_for_a_pattern_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    jar = tmp_path / "postgresql.jar"
    jar.write_bytes(b"")
    done = run_cli(tmp_path, "audit[1]", RIG_JDBC_JAR=str(jar))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--output" in lines[0] and "[ ]" in lines[0], done.stderr
    assert not (tmp_path / "audit[1]").exists()
