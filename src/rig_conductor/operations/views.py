"""The read models of the console's views and the API's: streams and groups, one group's
consumers with their liveness evidence, agents, the last scans and the reclaim history. Judged
with the reaper's own rules (`policy.liveness.Fleet`) at PostgreSQL's clock, so the console, the
API and the reaper agree.

Every read is bounded at any size: XINFO and one XPENDING of one entry per group, never a
whole pending list.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatchcase

from rig_conductor.adapters import failures, redis_inspect, redis_keys, redis_reading, redis_streams
from rig_conductor.adapters.postgres import history, queries
from rig_conductor.domain import ConsumerName, Evidence, GroupInfo, GroupName, StreamKey
from rig_conductor.policy.liveness import Fleet, age_ms
from rig_conductor.runtime import Runtime
from rig_conductor.settings import Settings


@dataclass(frozen=True, slots=True)
class GroupRow:
    stream: str
    group: str
    pending: int
    consumers: int
    oldest_idle_ms: int | None
    dead_letters: int
    down: int  # consumers down by rule 3
    held_by_down: int  # entries those down consumers hold


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    name: str
    agent: str | None
    heartbeat_age_ms: int | None
    pod: str  # live, gone, absent, unknown (or "-" with Kubernetes off)
    idle_ms: int
    pending: int
    down_reasons: tuple[str, ...]
    degraded: bool
    # May receive entries (rule 5): alive by its own evidence, not down, not degraded-stale.
    target: bool

    @property
    def state(self) -> str:
        if self.down_reasons:
            return "down"
        return "degraded" if self.degraded else "up"


@dataclass(frozen=True, slots=True)
class AgentRow:
    """An agent as the reaper judges it (`Fleet.agent_up`), with what it last reported."""

    agent_id: str
    last_heartbeat_at: datetime | None  # None: configured, never heard from
    heartbeat_age_ms: int | None
    down: bool
    degraded: bool  # as its last heartbeat said
    degraded_reasons: tuple[str, ...]
    consumers: tuple[str, ...]

    @property
    def state(self) -> str:
        if self.down:
            return "down"
        return "degraded" if self.degraded else "up"


@dataclass(frozen=True, slots=True)
class AgentSummary:
    up: int
    down: int
    degraded: int


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    groups: list[GroupRow]
    agents: AgentSummary
    scans: list[history.ScanRow]
    nodes_failed: dict[str, str]


def known_stream(settings: Settings, name: str) -> bool:
    """Whether a name a client sent is one of the streams the settings cover: the dispatch
    stream, a name RIG_STREAMS lists, or one of its patterns matches (a dead-letter stream
    never does, as in the reaper). A pattern itself is not a stream: reading it would SCAN the
    keyspace."""
    if not name or redis_streams.is_pattern(name) or "\\" in name:
        return False
    if name == settings.dispatch_stream or name in settings.streams:
        return True
    return not redis_keys.is_dlq(name) and any(
        fnmatchcase(name, pattern)
        for pattern in settings.streams
        if redis_streams.is_pattern(pattern)
    )


async def evidence(rt: Runtime) -> Evidence:
    return await queries.load_evidence(
        rt.engine,
        tenant=rt.settings.tenant,
        configured_agents=rt.settings.agent_ids,
        pods=rt.pods() if rt.pods is not None else None,
    )


async def overview(rt: Runtime, *, scans: int = 60) -> Overview:
    reading = await redis_reading.read(rt.servers(), rt.settings.streams)
    known = await evidence(rt)
    fleet = Fleet(known, rt.settings.limits)
    groups = reading.groups
    streams = sorted({g.stream for g in groups})
    letters = dict(
        zip(streams, await redis_inspect.dead_letter_counts(rt.redis, streams=streams), strict=True)
    )
    rows = []
    for group in groups:
        down = [c for c in group.consumers if fleet.is_down(c.name)]
        rows.append(
            GroupRow(
                group.stream,
                group.name,
                group.pending,
                len(group.consumers),
                group.oldest_idle_ms,
                letters.get(group.stream, 0),
                len(down),
                sum(c.pending for c in down),
            )
        )
    states = [agent.state for agent in await agents(rt, known=known)]
    return Overview(
        known.now,
        rows,
        AgentSummary(states.count("up"), states.count("down"), states.count("degraded")),
        await history.recent_scans(rt.engine, tenant=rt.settings.tenant, limit=scans),
        dict(reading.failed),
    )


async def agents(rt: Runtime, *, known: Evidence | None = None) -> list[AgentRow]:
    """Every agent configured or heard from, by id: down by the reaper's rule 3 (no heartbeat
    within RIG_AGENT_DOWN_MS, or none ever), with its last heartbeat's degraded state and
    reasons and the consumers that heartbeated for it. `known`: evidence already loaded."""
    if known is None:
        known = await evidence(rt)
    fleet = Fleet(known, rt.settings.limits)
    _, reported = await queries.list_agents(rt.engine, tenant=rt.settings.tenant)
    by_id = {row.agent_id: row for row in reported}
    rows = []
    for agent in sorted(known.known_agents):
        beat = known.agent_heartbeats.get(agent)
        row = by_id.get(agent)
        rows.append(
            AgentRow(
                agent_id=agent,
                last_heartbeat_at=beat.at if beat is not None else None,
                heartbeat_age_ms=age_ms(beat, known.now),
                down=not fleet.agent_up(agent),
                degraded=beat.degraded if beat is not None else False,
                degraded_reasons=row.degraded_reasons if row is not None else (),
                consumers=tuple(row.consumers) if row is not None else (),
            )
        )
    return rows


async def reclaims(
    rt: Runtime,
    *,
    stream: str | None,
    agent: str | None,
    reason: str | None,
    since: datetime | None,
    limit: int,
) -> list[history.ReclaimRow]:
    """The RECLAIMED rows of the event log of `stream`, from or to `agent`, with `reason`, since
    `since` (each None: any), newest first."""
    where = history.ReclaimFilter(stream=stream, agent=agent, reason=reason, since=since)
    return await history.reclaims(rt.engine, tenant=rt.settings.tenant, where=where, limit=limit)


async def group(rt: Runtime, *, stream: str, name: str) -> tuple[GroupInfo, list[ConsumerRow]]:
    """One group with its consumers judged; LookupError when there is no such group."""
    with failures.named_by_request():
        reading = await redis_reading.read(rt.servers(), [stream])
    found = next((g for g in reading.groups if g.name == name and g.stream == stream), None)
    if found is None:
        raise LookupError(f"no group {name!r} on stream {stream!r}")
    known = await evidence(rt)
    return found, consumer_rows(found, known, rt)


def consumer_rows(group: GroupInfo, known: Evidence, rt: Runtime) -> list[ConsumerRow]:
    fleet = Fleet(known, rt.settings.limits)
    kube = rt.pods is not None
    rows = []
    for info in group.consumers:
        verdict = fleet.owner(info.name)
        own = known.consumer_heartbeats.get(info.name)
        agent_beat = known.agent_heartbeats.get(verdict.agent) if verdict.agent else None
        ages = [a for a in (age_ms(own, known.now), age_ms(agent_beat, known.now)) if a is not None]
        rows.append(
            ConsumerRow(
                name=info.name,
                agent=verdict.agent,
                heartbeat_age_ms=min(ages) if ages else None,
                pod=known.pod(info.name).value if kube else "-",
                idle_ms=info.idle_ms,
                pending=info.pending,
                down_reasons=tuple(r.value for r in verdict.reasons),
                degraded=fleet.degraded_since(info.name) is not None,
                target=fleet.target(info) is not None,
            )
        )
    rows.sort(key=lambda r: (r.state != "down", r.state != "degraded", r.name))
    return rows


async def pending(
    rt: Runtime, *, stream: str, group: str, consumer: str, after: str | None, count: int
) -> list[redis_inspect.PendingRow]:
    """A page of the consumer's pending entries, with their fields."""
    with failures.named_by_request():
        rows = await redis_inspect.pending_page(
            rt.redis,
            stream=StreamKey(stream),
            group=GroupName(group),
            consumer=ConsumerName(consumer),
            after=after,
            count=count,
        )
    return rows
