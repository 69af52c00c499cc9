"""What the chaos soak observes and prints: the state of the issues in each consumer group
(PostgreSQL's event log, Redis's pending lists and dead-letter stream), the conductors' JSON
logs (reclaims, blind spells, Redis data losses) and the verdict, counted per group: work is
owned per group, so an issue lost, doubled or without its effect in any group fails the run.
It injects nothing and decides nothing about the run.

A "live agent reclaimed" is a reclaim with reason `down` whose from-consumer was an agent
process live at the time of the reclaim: heard (the conductor had received a heartbeat naming
its consumer: liveness is the conductor's receipt time) and not yet killed or exited. With
heartbeats every second and RIG_AGENT_DOWN_MS 3 s, only silence the conductor could not hear (a
blind spell) can make such an agent look down, so every such reclaim is one a blind spell
caused. A process still starting, not yet heard, is no live agent of the protocol: when every
earlier process of its agent was killed before it spoke, the agent is rightly down, and entries
moved to the new consumer (a target by its XGROUP CREATECONSUMER) move on.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chaos import Soak

DEAD_LETTERED = re.compile(r"\[StreamReclaim\] Dead-lettered \S+ on (\S+) after ")
TALLIES = (
    *("agent kills", "agent crashes", "conductor restarts", "conductor outages"),
    *("postgres restarts", "redis restarts", "dispatch retries"),
)


class Database:
    """The soak's own connection to PostgreSQL, made again once PostgreSQL is back."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.conn: Any = None

    async def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        import psycopg

        if self.conn is None or self.conn.closed:
            self.conn = await psycopg.AsyncConnection.connect(
                self.conninfo, autocommit=True, connect_timeout=5
            )
        try:
            return await self.conn.execute(sql, args)
        except psycopg.OperationalError:
            await self.close()
            raise

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
            self.conn = None


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
    """The issues of one group (work is owned per group). Raises while PostgreSQL or Redis is
    down: the caller looks again later."""
    from redis.exceptions import ResponseError

    completed: dict[str, set[tuple[str, int]]] = defaultdict(set)
    where = "WHERE tenant = %s AND stream = %s AND group_name = %s"
    args = (tenant, stream, group)
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
    letters = await redis.xrange(f"{stream}:dlq")
    letter_issues |= {f.get("issueId", "") for _, f in letters if f.get("group") == group}
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


# The first receipt of a heartbeat naming each consumer: its closed liveness intervals and its
# open one.
FIRST_HEARD = """
SELECT consumer, extract(epoch FROM min(heard)) FROM (
    SELECT consumer, heard_from AS heard FROM liveness
     WHERE tenant = %(tenant)s AND consumer IS NOT NULL
    UNION ALL
    SELECT consumer, heard_since FROM consumer_heartbeats WHERE tenant = %(tenant)s
) AS h GROUP BY consumer
"""


async def first_heard(db: Any, tenant: str) -> dict[str, float]:
    rows = await db.execute(FIRST_HEARD, {"tenant": tenant})
    return {consumer: float(at) for consumer, at in await rows.fetchall() if at is not None}


def live_reclaims(
    reclaims: Iterable[Reclaim],
    lifetimes: Mapping[str, tuple[float, float | None]],
    heard: Mapping[str, float],
) -> list[Reclaim]:
    """The `down` reclaims whose from-consumer's process (consumer -> (started, ended)) was live
    when the reclaim was logged: first heard (`heard`, consumer -> first receipt) at or before
    it, and not yet ended. A process that exited by itself ends when it was last seen alive, so
    a dead one is never taken for live; a consumer of no process the soak started is counted
    too, heard or not (a soak that cannot tell must not pass)."""
    live = []
    for reclaim in reclaims:
        if reclaim.reason != "down":
            continue
        if reclaim.source not in lifetimes:
            live.append(reclaim)
            continue
        started, ended = lifetimes[reclaim.source]
        since = max(started, heard.get(reclaim.source, float("inf")))
        if since <= reclaim.at and (ended is None or reclaim.at < ended):
            live.append(reclaim)
    return live


@dataclass
class GroupVerdict:
    """What became of the dispatched issues in one group: each group must finish each once."""

    group: str
    final: Snapshot
    effects: dict[str, list[tuple[str, int]]]  # issue -> committed files' (entry id, attempt)
    lost: set[str]
    double: set[str]
    missing: set[str]
    other_letters: set[str]  # dead-lettered but not poison
    unfinished: set[str]


def read_effects(directory: Path) -> dict[str, list[tuple[str, int]]]:
    effects: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for path in directory.glob("*.json"):
        effect = json.loads(path.read_text())
        effects[effect["issueId"]].append((effect["entryId"], int(effect["attempt"])))
    return effects


def judge(
    group: str,
    final: Snapshot,
    effects: dict[str, list[tuple[str, int]]],
    dispatched: set[str],
    poison: set[str],
) -> GroupVerdict:
    completed, letters = set(final.completed), final.dead_lettered
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
    unfinished = dispatched - completed - letters
    return GroupVerdict(group, final, effects, lost, double, missing, letters - poison, unfinished)


def header(soak: Soak) -> str:
    opts = soak.opts
    runtimes = Counter(seat.runtime for seat in soak.seats if seat.group == soak.groups[0])
    fleet = ", ".join(f"{runtime} {n}" for runtime, n in sorted(runtimes.items()))
    groups = (
        f"{len(soak.groups)} consumer groups on the one stream ({', '.join(soak.groups)}), "
        "each with agents of its own and each to finish every issue once"
        if len(soak.groups) > 1
        else "1 consumer group"
    )
    users = (
        "each agent id its own least-privilege Redis user (rig-conductor redis-acl, kept in "
        "Redis's aclfile)"
        if opts.agent_users
        else "agents as Redis's default user"
    )
    redis = (
        f"{opts.redis_restarts} Redis restarts (empty)"
        if opts.redis_restarts
        else "Redis restarts EXCLUDED (--redis-restarts 0)"
    )
    return (
        f"rig-conductor chaos soak {soak.run_id}: {opts.issues} issues ({len(soak.poison)} "
        f"poison), {opts.agents} agents, an agent SIGKILLed every {opts.kill_every:g}s, "
        f"{opts.conductor_restarts} conductor restarts, {opts.conductor_outages} conductor "
        f"outages and {opts.postgres_outages} PostgreSQL outages of {opts.outage_s:g}s, "
        f"{redis}, {opts.degraded_agents} always-degraded "
        f"agents, the first attempt of every {opts.hang_every}th issue hung; fleet "
        f"{opts.fleet} ({fleet} agent processes a group); {groups}; {users}"
    )


def per_group(verdicts: list[GroupVerdict], count: Callable[[GroupVerdict], int]) -> str:
    """`N`, or with several groups `N (group-a n, group-b m)`."""
    total = sum(count(v) for v in verdicts)
    if len(verdicts) == 1:
        return str(total)
    return f"{total} ({', '.join(f'{v.group} {count(v)}' for v in verdicts)})"


def agent_user_lines(soak: Soak) -> tuple[list[str], dict[str, set[str]]]:
    """With --agent-users: the users made and seen connected, and the NOPERM refusals in the
    agents' logs (a least-privilege user that does not suffice); the lines and the problems."""
    if not soak.opts.agent_users:
        return [], {}
    refused = {
        c.name
        for c in soak.children
        if c not in soak.conductors and "NOPERM" in c.log.read_text(errors="replace")
    }
    unseen = set(soak.passwords) - soak.users_seen
    lines = [
        f"agent redis users: {len(soak.passwords)} (seen connected: {len(soak.users_seen)})",
        f"NOPERM refusals: {len(refused)}",
    ]
    return lines, {"NOPERM refused agents": refused, "agent users never seen": unseen}


async def report(soak: Soak, redis: Any, db: Any, settled: bool, elapsed: float) -> bool:
    """Print the counts, a `name: value` a line (with several groups, each count is the sum
    over the groups, followed by each group's); True when the run failed."""
    dispatched = set(soak.entries)
    verdicts = []
    for group in soak.groups:
        final = await snapshot(redis, db, tenant=soak.tenant, stream=soak.stream, group=group)
        effects = read_effects(soak.out / group)
        verdicts.append(judge(group, final, effects, dispatched, soak.poison))
    per_issue = Counter(f.get("issueId", "") for _, f in await redis.xrange(soak.stream))
    twice = sorted(issue for issue, n in per_issue.items() if n > 1)
    rows = await db.execute(
        "SELECT count(*) FROM events WHERE tenant = %s AND stream = %s AND fenced",
        (soak.tenant, soak.stream),
    )
    fenced = await rows.fetchone()
    logs = read_logs((c.log.read_text(errors="replace") for c in soak.conductors), soak.stream)
    by_reason = Counter(r.reason for r in logs.reclaims)
    lifetimes = {c.name: (c.started_at, c.ended_at) for c in soak.children}
    live = live_reclaims(logs.reclaims, lifetimes, await first_heard(db, soak.tenant))
    user_lines, user_problems = agent_user_lines(soak)

    poison = soak.poison
    letters = per_group(verdicts, lambda v: len(v.final.dead_lettered))
    poisoned = per_group(verdicts, lambda v: len(v.final.dead_lettered & poison))
    others = per_group(verdicts, lambda v: len(v.other_letters))
    left = per_group(verdicts, lambda v: len(v.final.pending))
    undelivered = per_group(verdicts, lambda v: len(v.final.undelivered))
    staged = sum(len(list((soak.out / group).glob(".*.tmp"))) for group in soak.groups)
    opts, tally = soak.opts, soak.tally
    several = len(verdicts) > 1
    lines = [
        header(soak),
        f"dispatched: {len(dispatched)}",
        f"completed: {per_group(verdicts, lambda v: len(v.final.completed))}",
        f"dead-lettered: {letters} (poison {poisoned} of {len(poison)}"
        f"{' a group' if several else ''}, other {others}; by the reaper {logs.dead_lettered})",
        f"lost: {per_group(verdicts, lambda v: len(v.lost))}",
        f"unfinished: {per_group(verdicts, lambda v: len(v.unfinished))}",
        f"pending entries left: {left} (undelivered: {undelivered})",
        f"double-committed effects: {per_group(verdicts, lambda v: len(v.double))}",
        f"missing effects: {per_group(verdicts, lambda v: len(v.missing))}",
        f"fenced reports: {fenced[0] if fenced else 0}",
        f"reclaims: {len(logs.reclaims)}",
        "reclaims by reason: "
        + (", ".join(f"{reason} {n}" for reason, n in sorted(by_reason.items())) or "none"),
        f"live agents reclaimed by blind spells: {len(live)}",
        f"blind spells: {len(logs.blind_spells)} ({sum(logs.blind_spells):.1f}s in all)",
        f"redis data losses seen: {logs.redis_losses}",
        f"issues dispatched twice: {len(twice)}",
        f"orphaned staged files: {staged}",
        *user_lines,
        *(f"{name}: {tally[name]}" for name in TALLIES),
        f"duration: {elapsed:.1f}s",
    ]
    for v in verdicts:
        for entry_id, (issue, holder, deliveries) in sorted(v.final.pending.items())[:10]:
            state = "done" if issue in v.final.done else "not done"
            held = f"held by {holder} after {deliveries} deliveries"
            where = f" in group {v.group}" if several else ""
            lines.append(f"pending {entry_id}{where}: issue {issue} ({state}), {held}")
    for reclaim in live[:10]:
        when = datetime.fromtimestamp(reclaim.at).isoformat(timespec="milliseconds")
        lines.append(
            f"live agent reclaimed: {reclaim.entry_id} at {when}, "
            f"{reclaim.source} (alive) -> {reclaim.target}"
        )
    problems: dict[str, set[str]] = {}
    stories: dict[str, set[str]] = {}
    effects: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for v in verdicts:
        where = f" in group {v.group}" if several else ""
        problems |= {f"lost{where}": v.lost, f"double-committed{where}": v.double}
        problems |= {f"missing effects{where}": v.missing}
        problems |= {f"non-poison dead-lettered{where}": v.other_letters}
        stories |= {f"missing effect{where}": v.missing, f"double-committed{where}": v.double}
        stories |= {f"lost{where}": v.lost}
        for issue, files in v.effects.items():
            effects[issue] += files
    problems |= {"dispatched twice": set(twice)}
    problems |= {"not dispatched": set(soak.issues) - dispatched}
    problems |= {"live agents reclaimed": {r.entry_id for r in live}}
    problems |= user_problems
    for name, issues in problems.items():
        if issues:
            shown = sorted(issues)
            lines.append(f"{name}: {', '.join(shown[:20])}{' ...' if len(shown) > 20 else ''}")
    lines += await timelines(soak, db, stories, effects)
    lines += await hearings(soak, db, live)
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

    agents = {
        c.name: c.log.read_text(errors="replace") for c in soak.children if c not in soak.conductors
    }
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


async def hearings(soak: Soak, db: Any, live: Iterable[Reclaim]) -> list[str]:
    """What was heard of each live agent reclaimed as down, before its first such reclaim."""
    from chaos_hearing import hearing

    first: dict[str, float] = {}
    for reclaim in live:
        first[reclaim.source] = min(reclaim.at, first.get(reclaim.source, reclaim.at))
    if not first:
        return []
    processes = {c.name: c for c in soak.children}
    conductors = {c.name: c.log.read_text(errors="replace") for c in soak.conductors}
    lines: list[str] = []
    for consumer, at in sorted(first.items()):
        agents = [a for a in soak.agent_ids if consumer.startswith(f"{a}-")]
        process = processes.get(consumer)
        lines += await hearing(
            db,
            tenant=soak.tenant,
            consumer=consumer,
            agent=max(agents, key=len, default=consumer),
            reclaimed_at=at,
            log=process.log.read_text(errors="replace") if process else "",
            conductors=conductors,
            faults=soak.faults,
        )
    return lines
