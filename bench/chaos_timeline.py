"""The story of an issue the chaos soak found wrong (its effect missing or committed twice, or
the issue lost), for the report: the issue's rows in the event log, oldest first (when, kind,
consumer, group, attempt, fenced, detail; a row about a batch of entries counts when the batch
holds one of the issue's), beside the agents' log lines about its entries (the Python runtime's
JSON records, the TypeScript runtime's `<time> <LEVEL> rig-agent: <message>` lines) and the
soak's own faults (the kills of the consumers in the story, reclaim targets included, and every
scheduled fault from the story's start).
A failed run then says what happened to each such issue without a search through its logs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

# The entries of the issue: those its own rows name, and those the soak was given.
EVENTS = """
WITH ids AS (
    SELECT entry_id FROM events
    WHERE tenant = %s AND issue_id = %s AND entry_id IS NOT NULL
    UNION SELECT unnest(%s::text[])
)
SELECT extract(epoch FROM occurred_at), kind, consumer, attempt, fenced, entry_id,
       cardinality(entry_ids), detail, group_name
FROM events
WHERE tenant = %s
  AND (issue_id = %s OR entry_id IN (SELECT entry_id FROM ids)
       OR entry_ids && ARRAY(SELECT entry_id FROM ids))
ORDER BY occurred_at, id
"""
DETAIL_CHARS = 200
# A line of the TypeScript runtime's log (`clients/typescript/src/log.ts`).
TEXT_LINE = re.compile(r"(\S+) (?:INFO|WARNING|ERROR) rig-agent: (.*)")


@dataclass(frozen=True, order=True)
class Happening:
    at: float  # seconds since the epoch
    source: str  # "event", a process's name, or "soak"
    text: str


@dataclass(frozen=True)
class Fault:
    """A fault the soak injected: `consumer` is the agent it SIGKILLed, None for a scheduled
    fault (a conductor restart or outage, PostgreSQL stopped or started, Redis restarted)."""

    at: float
    text: str
    consumer: str | None = None


def event_text(row: Sequence[Any]) -> tuple[float, str, str | None]:
    """(when, the row as a line, its consumer) of one row of EVENTS."""
    at, kind, consumer, attempt, fenced, entry_id, batch, detail, group = row
    parts = [str(kind)]
    parts.append(f"entry {entry_id}" if entry_id else f"batch of {batch or 0} entries")
    if consumer:
        parts.append(f"consumer {consumer}")
    if group:
        parts.append(f"group {group}")
    if attempt is not None:
        parts.append(f"attempt {attempt}")
    if fenced:
        parts.append("FENCED")
    if detail:
        shown = json.dumps(detail, separators=(",", ":"), sort_keys=True)
        parts.append(shown if len(shown) <= DETAIL_CHARS else shown[:DETAIL_CHARS] + "...")
    return float(at), " ".join(parts), consumer


def log_lines(logs: Mapping[str, str], entry_ids: Iterable[str]) -> list[Happening]:
    """The records of each process's log (name -> its text) that name one of the entries: JSON
    records, and the TypeScript runtime's text lines."""
    ids = [entry_id for entry_id in entry_ids if entry_id]
    found = []
    for name, text in logs.items():
        for line in text.splitlines():
            if any(i in line for i in ids) and (record := parse_line(line)) is not None:
                found.append(Happening(record[0], name, record[1]))
    return found


def parse_line(line: str) -> tuple[float, str] | None:
    """(when, message) of a log line, or None for anything else (a crash's last words)."""
    try:
        if line.startswith("{"):
            record = json.loads(line)
            return datetime.fromisoformat(record["time"]).timestamp(), str(
                record.get("message", "")
            )
        if matched := TEXT_LINE.fullmatch(line):
            return datetime.fromisoformat(matched.group(1)).timestamp(), matched.group(2)
    except (ValueError, KeyError, TypeError):
        pass
    return None


def story(
    events: Iterable[Sequence[Any]],
    logs: Mapping[str, str],
    entry_ids: Iterable[str],
    faults: Iterable[Fault],
) -> list[Happening]:
    """Every happening of one issue, oldest first."""
    happenings: list[Happening] = []
    consumers: set[str] = set()
    ids = set(entry_ids)
    for row in events:
        at, text, consumer = event_text(row)
        happenings.append(Happening(at, "event", text))
        detail = row[7] if isinstance(row[7], dict) else {}
        consumers |= {c for c in (consumer, detail.get("toConsumer")) if c}  # a move's target too
        if row[5]:
            ids.add(str(row[5]))
    lines = log_lines(logs, ids)
    happenings += lines
    consumers |= {line.source for line in lines}
    start = min((h.at for h in happenings), default=0.0)
    for fault in faults:
        if fault.consumer in consumers or (fault.consumer is None and fault.at >= start):
            happenings.append(Happening(fault.at, "soak", fault.text))
    return sorted(happenings)


def render(issue: str, what: str, happenings: Sequence[Happening]) -> list[str]:
    """A heading and a line a happening, indented, so no line reads as a `name: value` count."""
    lines = [f"timeline of {issue} ({what}), {len(happenings)} happenings:"]
    start = happenings[0].at if happenings else 0.0
    for h in happenings:
        when = datetime.fromtimestamp(h.at, UTC).strftime("%H:%M:%S.%f")[:-3]
        lines.append(f"    {when} +{h.at - start:7.3f}s  {h.source:<18} {h.text}")
    if not happenings:
        lines.append("    (nothing in the event log, the agents' logs or the faults)")
    return lines


async def timeline(
    db: Any,
    *,
    tenant: str,
    issue: str,
    what: str,
    entry_ids: Iterable[str],
    logs: Mapping[str, str],
    faults: Iterable[Fault],
) -> list[str]:
    """The rendered story of `issue` (`what` is wrong with it), read from the event log."""
    known = sorted({entry_id for entry_id in entry_ids if entry_id})
    rows = await db.execute(EVENTS, (tenant, issue, known, tenant, issue))
    return render(issue, what, story(await rows.fetchall(), logs, known, faults))
