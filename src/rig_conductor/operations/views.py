"""The read models of the console's views and the API's: streams and groups, one group's
consumers with their liveness evidence, agents, the last scans and the reclaim history. Judged
with the reaper's own rules (`policy.liveness.Fleet`) at PostgreSQL's clock, so the console, the
API and the reaper agree.

Every read is bounded at any size: XINFO and one XPENDING of one entry per group, never a
whole pending list.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from fnmatch import fnmatchcase
from operator import attrgetter

from rig_conductor.adapters import failures
from rig_conductor.adapters.postgres import history, queries
from rig_conductor.adapters.redis import inspection as redis_inspect
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import reading as redis_reading
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import (
    AgentId,
    ConsumerName,
    Evidence,
    GroupInfo,
    GroupName,
    StreamKey,
)
from rig_conductor.operations import evidence as built
from rig_conductor.policy import measure, reclaim
from rig_conductor.policy.liveness import Fleet, age_ms
from rig_conductor.runtime import Runtime
from rig_conductor.settings import Settings

AGENTS_PAGE = 100  # agents (or one agent's consumers) per page unless asked otherwise
MAX_PAGE = 1_000
LISTED_CONSUMERS = 10  # consumers listed with each agent of a page, the freshest
by_name = attrgetter("name")


@dataclass(frozen=True, slots=True)
class ConsumerRow:
    name: str
    agent: str | None
    heartbeat_age_ms: int | None
    pod: str  # a PodState value: live, gone, absent, missing, unknown ("-": Kubernetes off)
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
    # The freshest LISTED_CONSUMERS consumers that heartbeated for it (one agent's view: a
    # page of them by name), and how many there are in all.
    consumers: tuple[str, ...]
    consumer_count: int = 0

    @property
    def state(self) -> str:
        return state_of(down=self.down, degraded=self.degraded)


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


async def evidence(rt: Runtime, *, consumers: Collection[str]) -> Evidence:
    """The reaper's evidence for the views of `consumers` (their own heartbeats only), with what
    Kubernetes said last: a page does not list the pods again."""
    pods = rt.pods.known() if rt.pods is not None else None
    return await built.load(rt.engine, rt.settings, pods=pods, consumers=consumers)


async def agents(
    rt: Runtime, *, after: str | None = None, limit: int = AGENTS_PAGE
) -> list[AgentRow]:
    """A page of the agents configured or heard from, by id after `after` (exclusive): down by
    rule 3 of docs/rules.md (no heartbeat within RIG_AGENT_DOWN_MS, or none ever), with its last
    heartbeat's degraded state and reasons, its freshest consumers and how many it has.

    Reads the page's agents and their `LISTED_CONSUMERS` freshest consumers, never the whole
    registry (keyset pages in PostgreSQL)."""
    tenant = rt.settings.tenant
    now, states = await queries.agents_page(
        rt.engine, tenant=tenant, configured=rt.settings.known_agents, after=after, limit=limit
    )
    consumers = await queries.freshest_consumers(
        rt.engine, tenant=tenant, agents=[s.agent_id for s in states], freshest=LISTED_CONSUMERS
    )
    fleet = _page_fleet(now, states, rt)
    return [_row(state, fleet, *consumers[state.agent_id]) for state in states]


async def agent(
    rt: Runtime, agent_id: str, *, after: str | None = None, limit: int = AGENTS_PAGE
) -> AgentRow | None:
    """One agent, judged as in `agents`, with a page of its consumers by name after `after`
    (exclusive); None when it is neither configured nor heard from."""
    tenant = rt.settings.tenant
    now, state = await queries.agent_state(rt.engine, tenant=tenant, agent=agent_id)
    if state is None:
        if agent_id not in rt.settings.known_agents:
            return None
        state = queries.AgentState(AgentId(agent_id), None, ())
    names = await queries.consumers_page(
        rt.engine, tenant=tenant, agent=agent_id, after=after, limit=limit
    )
    counted = await queries.freshest_consumers(
        rt.engine, tenant=tenant, agents=[agent_id], freshest=0
    )
    return _row(state, _page_fleet(now, [state], rt), names, counted[state.agent_id][1])


def _page_fleet(now: datetime, states: list[queries.AgentState], rt: Runtime) -> Fleet:
    """The reaper's rule 3 over the agents of one page: all it needs is their heartbeats."""
    beats = {s.agent_id: s.heartbeat for s in states if s.heartbeat is not None}
    known = Evidence(now, frozenset(s.agent_id for s in states), agent_heartbeats=beats)
    return Fleet(known, rt.settings.limits)


def _row(
    state: queries.AgentState, fleet: Fleet, consumers: list[ConsumerName], count: int
) -> AgentRow:
    beat = state.heartbeat
    return AgentRow(
        agent_id=state.agent_id,
        last_heartbeat_at=beat.at if beat is not None else None,
        heartbeat_age_ms=age_ms(beat, fleet.evidence.now),
        down=not fleet.agent_up(state.agent_id),
        degraded=beat.degraded if beat is not None else False,
        degraded_reasons=state.degraded_reasons,
        consumers=tuple(consumers),
        consumer_count=count,
    )


def state_of(*, down: bool, degraded: bool) -> str:
    """An agent's state as the console and the overview show it (`measure.agent_state`)."""
    return measure.agent_state(down=down, degraded=degraded)


async def reclaims(
    rt: Runtime,
    *,
    stream: str | None,
    agent: str | None,
    reason: str | None,
    since: datetime | None,
    limit: int,
    before_id: int | None = None,
) -> list[history.ReclaimRow]:
    """The RECLAIMED rows of the event log of `stream`, from or to `agent`, with `reason`, since
    `since` (each None: any), older than row `before_id` (None: the newest), newest first."""
    where = history.ReclaimFilter(
        stream=stream, agent=agent, reason=reason, since=since, before_id=before_id
    )
    return await history.reclaims(rt.engine, tenant=rt.settings.tenant, where=where, limit=limit)


async def group_consumers(
    rt: Runtime, *, stream: str, name: str, after: str | None, limit: int
) -> tuple[GroupInfo, list[ConsumerRow]]:
    """One group, read live, and a page of its consumers by name after `after`, judged with the
    heartbeats of that page's consumers only; LookupError when there is no such group."""
    found = await _read_group(rt, stream=stream, name=name)
    page = sorted((c for c in found.consumers if after is None or c.name > after), key=by_name)
    paged = replace(found, consumers=tuple(page[:limit]))
    known = await evidence(rt, consumers=[c.name for c in paged.consumers])
    rows = consumer_rows(paged, known, rt)
    return found, sorted(rows, key=by_name)


@dataclass(frozen=True, slots=True)
class MoveTarget:
    name: str
    pending: int
    degraded: bool


async def move_choices(
    rt: Runtime, *, stream: str, name: str, consumer: str
) -> tuple[GroupInfo, ConsumerRow | None, list[MoveTarget]]:
    """One group read live, `consumer` judged, and the consumers its entries may move to by
    hand (rule 5, best ranked first, on the evidence the move itself checks them on);
    LookupError when there is no such group. Only `consumer` gets a whole row: a group of
    thousands costs a target check each, not a page's rows."""
    found = await _read_group(rt, stream=stream, name=name)
    names = [c.name for c in found.consumers]
    known = await built.for_move(rt.engine, rt.settings, rt.pods, consumers=names)
    fleet = Fleet(known, rt.settings.limits)
    mine = tuple(c for c in found.consumers if c.name == consumer)
    owner = next(iter(consumer_rows(replace(found, consumers=mine), known, rt)), None)
    candidates = reclaim.rank_targets(found, fleet, besides=ConsumerName(consumer))
    return found, owner, [MoveTarget(t.consumer, t.pending, t.degraded) for t in candidates]


async def _read_group(rt: Runtime, *, stream: str, name: str) -> GroupInfo:
    """XINFO of the stream's groups and of this group's consumers (Redis has no paging for
    them: a page is cut here)."""
    with failures.named_by_request():
        reading = await redis_reading.read(rt.servers(), [stream], only=name)
    found = next((g for g in reading.groups if g.name == name and g.stream == stream), None)
    if found is None:
        raise LookupError(f"no group {name!r} on stream {stream!r}")
    return found


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
                target=fleet.target(info, stream=group.stream, group=group.name) is not None,
            )
        )
    rows.sort(key=lambda r: (r.state != "down", r.state != "degraded", r.name))
    return rows


async def pending(
    rt: Runtime, *, stream: str, group: str, consumer: str | None, after: str | None, count: int
) -> list[redis_inspect.PendingRow]:
    """A page of the consumer's pending entries (None: the whole group's), with their fields."""
    with failures.named_by_request():
        rows = await redis_inspect.pending_page(
            rt.redis,
            stream=StreamKey(stream),
            group=GroupName(group),
            consumer=ConsumerName(consumer) if consumer is not None else None,
            after=after,
            count=count,
        )
    return rows
