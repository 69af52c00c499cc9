"""What an audit writes: summary.json (the contract's keys), the Parquet tables, the plots and
report.html."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

    from rig_conductor.audit import report
    from rig_conductor.audit.sources import RedisSnapshot
from rig_conductor.audit.session import AuditOptions
from rig_conductor.audit.stages import Findings, Loaded, ms_since

logger = logging.getLogger(__name__)

LATENCY_BINS = 40
TIMELINE_DOWN_PERIODS = 20_000  # down periods drawn in the availability plot, at most
# Rows the driver holds of any per-entry result, at most: the report's tables and summary.json's
# agents. summary.json's `lost` and `duplicates` are whole, streamed a partition at a time.
LISTED_AT_MOST = 1_000


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _ms(value: float | None) -> int:
    return 0 if value is None else round(value)


def summarize(
    findings: Findings,
    *,
    settings: Settings,
    options: AuditOptions,
    loaded: Loaded,
    snapshot: RedisSnapshot,
    window_end: datetime,
) -> tuple[dict[str, Any], report.ReportData]:
    """Collect the findings' small results into summary.json's shape and the report's data.

    `lost` and `duplicates` carry exactly the contract's keys, for the first LISTED_AT_MOST in
    order (`lostCount` and `duplicateCount` count them all): what the report shows.
    `write_outputs` writes them whole to summary.json; the details are in Parquet.
    """
    from pyspark.sql import functions as F

    totals = _one(findings.status.transform(_totals))
    latency = _one(findings.latency)
    lost = findings.lost.select("stream", "entry_id", "issue_id").take(LISTED_AT_MOST)
    duplicates = findings.duplicates.select("issue_id", "consumers").take(LISTED_AT_MOST)
    agents = findings.availability.take(LISTED_AT_MOST)
    summary: dict[str, Any] = {
        "dispatched": totals["dispatched"],
        "completed": totals["completed"],
        "deadLettered": totals["dead_lettered"],
        "pending": totals["pending"],
        "lost": [
            {"stream": stream, "entryId": entry, "issueId": issue} for stream, entry, issue in lost
        ],
        "duplicates": [
            {"issueId": r["issue_id"], "consumers": list(r["consumers"])} for r in duplicates
        ],
        "lostCount": totals["lost"],
        "duplicateCount": findings.duplicates.count(),
        "reclaims": latency["reclaims"],
        "reclaimsByReason": _by_reason(findings.reclaims),
        "reclaimLatencyMs": {key: _ms(latency[key]) for key in ("p50", "p95", "max")},
        "tenant": settings.tenant,
        "window": _window(options, window_end, snapshot),
        "events": loaded.rows,
        "jdbcPartitions": loaded.partitions,
        "requeued": totals["requeued"],
        "pendingInPel": totals["pending_in_pel"],
        "pendingUndelivered": totals["pending_undelivered"],
        "deadLetteredOutsideLog": totals["dead_lettered_outside_log"],
        "completedStillPending": totals["completed_still_pending"],
        "reclaimLatencySamples": latency["measured"],
        "overlappingAttemptReports": findings.overlaps.count(),
        "fencedReports": findings.reports.where(F.col("fenced")).count(),
        "consumersWithoutHeartbeat": findings.sightings.count(),
        "agentDownMs": settings.agent_down_ms,
        "agentCount": findings.availability.count(),
        "agents": [_agent(a) for a in agents],
        "deadLetterRate": [_rate(r) for r in findings.dead_letter_rate.collect()],
        "redis": _redis(snapshot),
    }
    return summary, _report_data(findings, agents, window_end)


def _window(options: AuditOptions, end: datetime, snapshot: RedisSnapshot) -> dict[str, Any]:
    """The time the audit covers, and when it read Redis."""
    return {
        "since": _iso(options.since),
        "until": _iso(options.until),
        "end": _iso(end),
        "redisReadAt": _iso(snapshot.taken_at),
    }


def _redis(snapshot: RedisSnapshot) -> dict[str, Any]:
    """What the audit read from Redis, counted."""
    return {
        "streams": snapshot.streams,
        "missingStreams": snapshot.missing,
        "groups": snapshot.groups,
        "pendingEntries": len(snapshot.pending),
        "deadLetters": len(snapshot.letters),
    }


def _by_reason(reclaims: DataFrame) -> dict[str, int]:
    from rig_conductor.audit import timelines

    return {r["reason"]: r["reclaims"] for r in timelines.reclaims_by_reason(reclaims).collect()}


def _agent(a: Row) -> dict[str, Any]:
    """One agent's availability, as summary.json lists it."""
    return {
        "agentId": a["agent_id"],
        "availability": round(float(a["availability"]), 6),
        "downMs": _ms(a["down_ms"]),
        "detectedDownMs": _ms(a["detected_down_ms"]),
        "downPeriods": a["down_periods"],
        "downAtEnd": bool(a["down_at_end"]),
        "heartbeats": a["heartbeats"],
        "lastHeartbeatAt": _iso(a["last_heartbeat"]),
    }


def _rate(r: Row) -> dict[str, Any]:
    """One stream's dead-letter rate, as summary.json lists it."""
    return {
        "stream": r["stream"],
        "dispatched": r["dispatched"],
        "deadLettered": r["dead_lettered"],
        "rate": r["dead_letter_rate"],
    }


def _totals(status: DataFrame) -> DataFrame:
    from rig_conductor.audit import tallies

    return tallies.totals(status)


def _one(frame: DataFrame) -> Row:
    row = frame.first()
    assert row is not None  # an aggregate without grouping always answers one row
    return row


def _report_data(findings: Findings, agents: list[Row], window_end: datetime) -> report.ReportData:
    from pyspark.sql import functions as F

    from rig_conductor.audit import report

    shown = [a["agent_id"] for a in agents[: report.MAX_TIMELINE_AGENTS]]
    periods: dict[str, list[tuple[datetime, datetime]]] = {}
    if shown:
        rows = (
            findings.down_periods.where(F.col("agent_id").isin(shown))
            .limit(TIMELINE_DOWN_PERIODS)
            .collect()
        )
        for row in rows:
            periods.setdefault(row["agent_id"], []).append(
                (row["down_from"].astimezone(UTC), row["down_until"].astimezone(UTC))
            )
    return report.ReportData(
        latency_bins=[
            report.HistogramBin(r["bin_start_ms"], r["bin_end_ms"], r["count"])
            for r in findings.histogram.collect()
        ],
        timelines=[
            report.AgentTimeline(
                a["agent_id"],
                a["first_heartbeat"].astimezone(UTC),
                float(a["availability"]),
                periods.get(a["agent_id"], []),
            )
            for a in agents
        ],
        window_end=window_end,
        pending=[
            report.PendingPoint(
                r["bucket_start"].astimezone(UTC), r["dispatched"], r["finished"], r["outstanding"]
            )
            for r in findings.pending_over_time.collect()
        ],
    )


def write_outputs(
    findings: Findings,
    summary: dict[str, Any],
    data: report.ReportData,
    directory: Path,
    *,
    timings: Mapping[str, int] | None = None,
) -> None:
    """Plots and report.html, then summary.json (written whole, last)."""
    from dataclasses import replace

    from rig_conductor.audit import report

    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    # The Parquet tables were written as the rules ran (job.reconcile_all).
    tables = {name: name for name in findings.tables()}
    summary["tables"] = tables
    data = replace(data, tables=tables)
    plots = report.write_plots(directory, summary, data)
    summary["plots"] = plots
    report.write_html(directory / "report.html", summary, data, plots)
    if timings is not None:
        summary["timingsMs"] = {**timings, "writeMs": ms_since(started)}
    partial = directory / "summary.json.partial"
    _write_summary(partial, summary, findings)
    partial.replace(directory / "summary.json")


def _write_summary(path: Path, summary: Mapping[str, Any], findings: Findings) -> None:
    """summary.json with every lost entry and every duplicate issue (the contract's lists, in
    the order the report shows them), streamed from Spark a partition at a time: the driver
    never holds a whole list, however long."""
    lost = (
        {"stream": r["stream"], "entryId": r["entry_id"], "issueId": r["issue_id"]}
        for r in findings.lost.select("stream", "entry_id", "issue_id").toLocalIterator()
    )
    duplicates = (
        {"issueId": r["issue_id"], "consumers": list(r["consumers"])}
        for r in findings.duplicates.select("issue_id", "consumers").toLocalIterator()
    )
    rest = {key: value for key, value in summary.items() if key not in ("lost", "duplicates")}
    with path.open("w", encoding="utf-8") as out:
        out.write("{")
        for key, items in (("lost", lost), ("duplicates", duplicates)):
            out.write(f'\n  "{key}": [')
            written = 0
            for item in items:
                out.write(("," if written else "") + "\n    " + json.dumps(item))
                written += 1
            out.write("\n  ]," if written else "],")
        out.write("\n" + json.dumps(rest, indent=2)[2:] + "\n")
