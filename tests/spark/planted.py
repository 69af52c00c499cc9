"""A synthetic event log of any size with known anomalies, bulk-loaded into PostgreSQL with COPY,
and the few entries still pending written to Redis: what the audit must find, planted where
every JDBC partition holds some of it.

Each dispatched entry plays one role. Most are completed (assigned, started, completed); a
seeded random sample spread over the whole id range is lost, done twice by a fenced zombie,
still pending, reclaimed (for a reason: down, pod-gone or degraded) or dead-lettered. `plant`
returns the exact sets, so a test can demand precision and recall 1.0, and the bench can check
its findings. Test and bench code only: it writes straight into the tables.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg
import redis

BASE = datetime(2025, 1, 1, tzinfo=UTC)
STEP = timedelta(milliseconds=100)  # between entries; an entry's events 10 ms apart
AGENTS = 50
GROUP = "g"
STREAMS = 4
REASONS = ("down", "pod-gone", "degraded")  # a reclaimed entry's reason, by its index
ROLES = ("lost", "duplicate", "pending", "reclaimed", "dead")
COLUMNS = (
    "tenant, occurred_at, kind, agent_id, consumer, stream, group_name, entry_id, issue_id, "
    "attempt, fenced, detail"
)

Entry = tuple[str, str]  # (stream, entry_id)


@dataclass
class Planted:
    """What a planted tenant holds, and what the audit must find in it."""

    tenant: str
    entries: int
    events: int = 0
    lost: set[Entry] = field(default_factory=set)
    duplicates: set[str] = field(default_factory=set)  # issue ids
    pending: set[Entry] = field(default_factory=set)
    dead: set[Entry] = field(default_factory=set)
    reclaimed: dict[str, set[Entry]] = field(default_factory=dict)  # reason -> entries

    @property
    def until(self) -> datetime:
        """Just after the last event: the audit window's end."""
        return BASE + STEP * (self.entries + 10)

    @property
    def streams(self) -> list[str]:
        return [f"{self.tenant}:s{n}" for n in range(STREAMS)]

    def expected(self) -> dict[str, int]:
        """summary.json's counts for this log."""
        anomalies = len(self.lost) + len(self.pending) + len(self.dead)
        return {
            "dispatched": self.entries,
            "completed": self.entries - anomalies,
            "deadLettered": len(self.dead),
            "pending": len(self.pending),
            "lost": len(self.lost),
            "duplicates": len(self.duplicates),
            "reclaims": sum(len(e) for e in self.reclaimed.values()),
        }

    def by_reason(self) -> dict[str, int]:
        return {reason: len(found) for reason, found in sorted(self.reclaimed.items())}


def roles(entries: int, per_role: int, seed: int = 18) -> dict[int, str]:
    """`per_role` entries of each anomalous role, spread over the whole range: one random entry
    in each of `per_role * len(ROLES)` equal strata, the roles taking turns."""
    rng, total = random.Random(seed), per_role * len(ROLES)
    return {
        rng.randrange(n * entries // total, (n + 1) * entries // total): ROLES[n % len(ROLES)]
        for n in range(total)
    }


def entries_for(events: int) -> int:
    """Entries that make about `events` events (3.27 events per entry on average)."""
    return max(10, round(events / 3.27))


def _json(value: dict[str, object]) -> str:
    return json.dumps(value, separators=(",", ":"))


def _line(*values: object) -> str:
    """One row in COPY's text format (no tabs, newlines or backslashes occur in ours)."""
    return "\t".join(
        "\\N" if v is None else ("t" if v else "f") if isinstance(v, bool) else str(v)
        for v in values
    )


def _rows(tenant: str, planted: Planted, role_of: dict[int, str]) -> Iterator[str]:
    """Every event of the log, in id order: the entry's, then every 4th entry a heartbeat."""
    for i in range(planted.entries):
        role = role_of.get(i, "completed")
        stream, entry, issue = f"{tenant}:s{i % STREAMS}", f"{1_700_000_000_000 + i}-0", f"is-{i}"
        at = BASE + STEP * i
        agent, other = f"w{i % AGENTS}", f"w{(i + 1) % AGENTS}"
        me, them = f"{agent}-0", f"{other}-0"
        tick = iter(range(10))

        def event(
            kind: str,
            a: str | None = None,
            c: str | None = None,
            attempt: int | None = None,
            fenced: bool = False,
            detail: str = "{}",
            group: str | None = None,
            issue_id: str | None = issue,
            at: datetime = at,
            tick: Iterator[int] = tick,
            stream: str | None = stream,
            entry: str | None = entry,
        ) -> str:
            when = (at + timedelta(milliseconds=10 * next(tick))).isoformat()
            values = (kind, a, c, stream, group, entry, issue_id, attempt, fenced, detail)
            return _line(tenant, when, *values)

        yield event("ISSUE_ASSIGNED", a=agent)
        if role != "pending" or i % 2:
            yield event("WORK_STARTED", agent, me, 1)
        if role in ("duplicate", "reclaimed"):
            reason = "down" if role == "duplicate" else REASONS[i % len(REASONS)]
            beat = (at - timedelta(seconds=600 + i % 300)).isoformat()
            detail = {"toConsumer": them, "toAgent": other, "reason": reason}
            detail |= {"lastHeartbeatAt": beat, "idleMs": 300_000 + i % 1000, "deliveries": 1}
            yield event("RECLAIMED", agent, me, detail=_json(detail), group=GROUP, issue_id=None)
            planted.reclaimed.setdefault(reason, set()).add((stream, entry))
            yield event("WORK_STARTED", other, them, 2)
            if role == "duplicate":  # the zombie reports after the new attempt started: fenced
                yield event("WORK_COMPLETED", agent, me, 1, fenced=True)
                planted.duplicates.add(issue)
            yield event("WORK_COMPLETED", other, them, 2)
        elif role == "dead":
            detail = {"dlqId": f"{1_700_000_000_000 + i}-1", "reason": "max-deliveries"}
            yield event("DEAD_LETTERED", agent, me, detail=_json(detail | {"deliveries": 5}))
            planted.dead.add((stream, entry))
        elif role == "lost":
            planted.lost.add((stream, entry))
        elif role == "pending":
            planted.pending.add((stream, entry))
        else:
            yield event("WORK_COMPLETED", agent, me, 1)
        if i % 4 == 0:
            beating = f"w{i // 4 % AGENTS}"
            none: dict[str, None] = {"issue_id": None, "stream": None, "entry": None}
            yield event("HEARTBEAT", beating, f"{beating}-0", **none)


def plant(conninfo: str, tenant: str, entries: int, per_role: int) -> Planted:
    """Replace `tenant`'s events with a planted log of `entries` dispatched entries (COPY)."""
    planted = Planted(tenant, entries)
    role_of = roles(entries, per_role)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM events WHERE tenant = %s", (tenant,))
        with conn.cursor() as cursor, cursor.copy(f"COPY events ({COLUMNS}) FROM STDIN") as copy:
            lines: list[str] = []
            for line in _rows(tenant, planted, role_of):
                lines.append(line)
                if len(lines) >= 50_000:
                    copy.write("\n".join(lines) + "\n")
                    planted.events += len(lines)
                    lines.clear()
            if lines:
                copy.write("\n".join(lines) + "\n")
                planted.events += len(lines)
        conn.execute("ANALYZE events")
    return planted


def describe(tenant: str, entries: int, per_role: int) -> Planted:
    """What `plant` with these arguments wrote, without writing it again."""
    planted = Planted(tenant, entries)
    planted.events = sum(1 for _ in _rows(tenant, planted, roles(entries, per_role)))
    return planted


def plant_redis(client: redis.Redis, planted: Planted) -> None:
    """The pending entries in their streams: the first half of each stream's read by a consumer
    (in its PEL), the rest not yet delivered. Streams replaced whole."""
    by_stream: dict[str, list[str]] = {}
    for stream, entry in planted.pending:
        by_stream.setdefault(stream, []).append(entry)
    for stream in planted.streams:
        client.delete(stream, f"{stream}:dlq")
    for stream, ids in by_stream.items():
        ids.sort(key=lambda e: int(e.split("-")[0]))
        pipe = client.pipeline(transaction=False)
        for entry in ids:
            pipe.xadd(stream, {"type": "ISSUE_ASSIGNED"}, id=entry)
        pipe.execute()
        client.xgroup_create(stream, GROUP, id="0")
        if len(ids) // 2:
            client.xreadgroup(GROUP, "w0-0", {stream: ">"}, count=len(ids) // 2)
