"""What the chaos soak observes and prints: the state of the issues (PostgreSQL's event log,
Redis's pending list and dead-letter stream), the conductors' JSON logs (reclaims, blind spells,
Redis data losses) and the verdict. It injects nothing and decides nothing about the run.

A "live agent reclaimed" is a reclaim with reason `down` whose from-consumer was an agent
process alive at the time of the reclaim: not yet killed, not yet exited. With heartbeats every
0.5 s and RIG_AGENT_DOWN_MS 3 s, only silence the conductor could not hear (a blind spell) can
make a live agent look down, so every such reclaim is one a blind spell caused.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos import Soak

DEAD_LETTERED = re.compile(r"\[StreamReclaim\] Dead-lettered \S+ on (\S+) after ")
TALLIES = (
    *("agent kills", "agent crashes", "conductor restarts", "conductor outages"),
    *("postgres restarts", "redis restarts", "dispatch retries"),
)


@dataclass
class Snapshot:
    completed: dict[str, set[tuple[str, int]]]  # issue -> accepted (entry id, attempt)
    dead_lettered: set[str]  # issues in the dead-letter stream or the event log's DEAD_LETTERED
    pending: dict[str, tuple[str, str, int]]  # entry id -> (issue, holder, deliveries)
    undelivered: set[str]  # issues whose entry the group has not delivered yet

    @property
    def done(self) -> set[str]:
        return set(self.completed) | self.dead_lettered

    def unsettled(self) -> set[str]:
        return {issue for issue, _, _ in self.pending.values()} | self.undelivered


# A completion carried over to the entry that replaces one Redis lost (its outputs were not
# published yet) restates the accepted one: it is not another completion.
NOT_CARRIED = "NOT (detail ? 'carriedFrom')"


async def snapshot(redis: Any, db: Any, *, tenant: str, stream: str, group: str) -> Snapshot:
    """Raises while PostgreSQL or Redis is down: the caller looks again later."""
    from redis.exceptions import ResponseError

    completed: dict[str, set[tuple[str, int]]] = defaultdict(set)
    where, args = "WHERE tenant = %s AND stream = %s", (tenant, stream)
    rows = await db.execute(
        f"SELECT issue_id, entry_id, attempt FROM events {where} "
        f"AND kind = 'WORK_COMPLETED' AND NOT fenced AND {NOT_CARRIED}",
        args,
    )
    for issue, entry_id, attempt in await rows.fetchall():
        completed[issue].add((entry_id, attempt))
    # The reaper's dead letters are in the event log too: a Redis restarted empty loses the
    # dead-letter stream, and the conductor does not dispatch a dead-lettered issue again.
    rows = await db.execute(f"SELECT issue_id FROM events {where} AND kind = 'DEAD_LETTERED'", args)
    letter_issues = {issue for (issue,) in await rows.fetchall() if issue}
    letter_issues |= {f.get("issueId", "") for _, f in await redis.xrange(f"{stream}:dlq")}
    pending: dict[str, tuple[str, str, int]] = {}
    undelivered: set[str] = set()
    with contextlib.suppress(ResponseError):  # NOGROUP: no agent has joined (again) yet
        for row in await redis.xpending_range(stream, group, "-", "+", 1_000_000):
            found = await redis.xrange(stream, row["message_id"], row["message_id"])
            issue = found[0][1].get("issueId", "") if found else row["message_id"]
            pending[row["message_id"]] = (issue, row["consumer"], row["times_delivered"])
    with contextlib.suppress(ResponseError):  # no stream yet
        groups = await redis.xinfo_groups(stream)
        last = next((g["last-delivered-id"] for g in groups if g["name"] == group), "0-0")
        undelivered = {f["issueId"] for _, f in await redis.xrange(stream, f"({last}")}
    return Snapshot(dict(completed), letter_issues, pending, undelivered)


@dataclass(frozen=True)
class Reclaim:
    at: float  # seconds since the epoch, as logged
    entry_id: str
    source: str
    target: str
    reason: str


@dataclass
class ConductorLogs:
    """What the conductors' JSON logs say about one stream."""

    reclaims: list[Reclaim] = field(default_factory=list)
    dead_lettered: int = 0
    blind_spells: list[float] = field(default_factory=list)  # their lengths, seconds
    redis_losses: int = 0  # `Redis lost its data` warnings


def read_logs(texts: Iterable[str], stream: str) -> ConductorLogs:
    found = ConductorLogs()
    for text in texts:
        for line in text.splitlines():
            if not line.startswith("{"):
                continue  # not a record of the conductor's (a crash's last words)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            message = str(record.get("message", ""))
            if message.startswith("Blind spell over"):
                found.blind_spells.append(float(record.get("blindSeconds", 0)))
            elif record.get("stream") != stream:
                continue
            elif message.startswith("[StreamReclaim] Reclaimed"):
                at = datetime.fromisoformat(record["time"]).timestamp()
                found.reclaims.append(
                    Reclaim(
                        at,
                        record["entryId"],
                        record["fromConsumer"],
                        record["toConsumer"],
                        record.get("reason", ""),
                    )
                )
            elif DEAD_LETTERED.match(message):
                found.dead_lettered += 1
            elif message.startswith("Redis lost its data"):
                found.redis_losses += 1
    return found


def live_reclaims(
    reclaims: Iterable[Reclaim], lifetimes: Mapping[str, tuple[float, float | None]]
) -> list[Reclaim]:
    """The `down` reclaims whose from-consumer's process (consumer -> (started, ended)) was
    alive when the reclaim was logged. A process that exited by itself ends when it was last
    seen alive, so a dead one is never taken for live; a consumer of no process the soak
    started is counted too (a soak that cannot tell must not pass)."""
    live = []
    for reclaim in reclaims:
        if reclaim.reason != "down":
            continue
        started, ended = lifetimes.get(reclaim.source, (0.0, None))
        if started <= reclaim.at and (ended is None or reclaim.at < ended):
            live.append(reclaim)
    return live


async def report(soak: Soak, redis: Any, db: Any, settled: bool, elapsed: float) -> bool:
    """Print the counts, a `name: value` a line; True when the run failed."""
    final = await snapshot(redis, db, tenant=soak.tenant, stream=soak.stream, group=soak.group)
    per_issue = Counter(f.get("issueId", "") for _, f in await redis.xrange(soak.stream))
    twice = sorted(issue for issue, n in per_issue.items() if n > 1)
    rows = await db.execute(
        "SELECT count(*) FROM events WHERE tenant = %s AND stream = %s AND fenced",
        (soak.tenant, soak.stream),
    )
    fenced = await rows.fetchone()
    effects: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in soak.out.glob("*.json"):
        effect = json.loads(path.read_text())
        effects[effect["issueId"]].append((effect["entryId"], int(effect["attempt"])))
    logs = read_logs((c.log.read_text(errors="replace") for c in soak.conductors), soak.stream)
    by_reason = Counter(r.reason for r in logs.reclaims)
    lifetimes = {c.name: (c.started_at, c.ended_at) for c in soak.children}
    live = live_reclaims(logs.reclaims, lifetimes)

    dispatched, completed = set(soak.entries), set(final.completed)
    letters = final.dead_lettered
    lost = dispatched - completed - letters - final.unsettled()
    double = {  # more than one committed file or accepted attempt, or a file not accepted
        issue
        for issue in completed | set(effects)
        if len(effects[issue]) > 1
        or len(final.completed.get(issue, ())) > 1
        or any(f not in final.completed.get(issue, ()) for f in effects[issue])
    }
    # Every completed issue without its committed file, whatever happened to it meanwhile.
    missing = {i for i in completed if not effects[i] and i not in double}
    other_letters = letters - soak.poison
    opts, tally = soak.opts, soak.tally
    lines = [
        f"rig-conductor chaos soak {soak.run_id}: {opts.issues} issues ({len(soak.poison)} "
        f"poison), {opts.agents} agents, an agent SIGKILLed every {opts.kill_every:g}s, "
        f"{opts.conductor_restarts} conductor restarts, {opts.conductor_outages} conductor "
        f"outages and {opts.postgres_outages} PostgreSQL outages of {opts.outage_s:g}s, "
        f"{opts.redis_restarts} Redis restarts (empty), {opts.degraded_agents} always-degraded "
        f"agents, the first attempt of every {opts.hang_every}th issue hung",
        f"dispatched: {len(dispatched)}",
        f"completed: {len(completed)}",
        f"dead-lettered: {len(letters)} (poison {len(letters & soak.poison)} of "
        f"{len(soak.poison)}, other {len(other_letters)}; by the reaper {logs.dead_lettered})",
        f"lost: {len(lost)}",
        f"unfinished: {len(dispatched - completed - letters)}",
        f"pending entries left: {len(final.pending)} (undelivered: {len(final.undelivered)})",
        f"double-committed effects: {len(double)}",
        f"missing effects: {len(missing)}",
        f"fenced reports: {fenced[0] if fenced else 0}",
        f"reclaims: {len(logs.reclaims)}",
        "reclaims by reason: "
        + (", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items())) or "none"),
        f"live agents reclaimed by blind spells: {len(live)}",
        f"blind spells: {len(logs.blind_spells)} ({sum(logs.blind_spells):.1f}s in all)",
        f"redis data losses seen: {logs.redis_losses}",
        f"issues dispatched twice: {len(twice)}",
        f"orphaned staged files: {len(list(soak.out.glob('.*.tmp')))}",
        *(f"{name}: {tally[name]}" for name in TALLIES),
        f"duration: {elapsed:.1f}s",
    ]
    for entry_id, (issue, holder, deliveries) in sorted(final.pending.items())[:10]:
        state = "done" if issue in final.done else "not done"
        held = f"held by {holder} after {deliveries} deliveries"
        lines.append(f"pending {entry_id}: issue {issue} ({state}), {held}")
    for reclaim in live[:10]:
        when = datetime.fromtimestamp(reclaim.at).isoformat(timespec="milliseconds")
        lines.append(
            f"live agent reclaimed: {reclaim.entry_id} at {when}, "
            f"{reclaim.source} (alive) -> {reclaim.target}"
        )
    problems = {"lost": lost, "double-committed": double, "missing effects": missing}
    problems |= {"non-poison dead-lettered": other_letters, "dispatched twice": set(twice)}
    problems |= {"not dispatched": set(soak.issues) - dispatched}
    problems |= {"live agents reclaimed": {r.entry_id for r in live}}
    for name, issues in problems.items():
        if issues:
            shown = sorted(issues)
            lines.append(f"{name}: {', '.join(shown[:20])}{' ...' if len(shown) > 20 else ''}")
    stories = {"missing effect": missing, "double-committed": double, "lost": lost}
    lines += await timelines(soak, db, stories, effects)
    if not settled:
        lines.append(f"did not settle within {opts.timeout:g}s")
    failed = any(problems.values()) or not settled
    lines.append(f"result: {'FAIL' if failed else 'PASS'}")
    print("\n".join(lines), flush=True)
    return failed


async def timelines(
    soak: Soak,
    db: Any,
    stories: Mapping[str, set[str]],
    effects: Mapping[str, list[tuple[str, int]]],
) -> list[str]:
    """The timeline of every issue of `stories` (what is wrong -> those issues)."""
    from chaos_timeline import timeline

    agents = {c.name: c.log.read_text(errors="replace") for c in soak.children}
    agents = {name: text for name, text in agents.items() if name.startswith("chaos-")}
    lines: list[str] = []
    for what, issues in stories.items():
        for issue in sorted(issues):
            known = [soak.entries.get(issue, ""), *(entry for entry, _ in effects.get(issue, []))]
            lines += await timeline(
                db,
                tenant=soak.tenant,
                issue=issue,
                what=what,
                entry_ids=known,
                logs=agents,
                faults=soak.faults,
            )
    return lines
