"""Properties of the reclaim plan over arbitrary fleets (hypothesis).

Whatever the evidence: never target an entry's own owner, never a consumer that is down or
whose agent is down, never move a fresh entry of a down owner without pod evidence, never touch
an entry whose owner is alive and not degraded-stale, move a degraded owner's entries only to
non-degraded targets, spread within one entry of the water level, and account for every entry
it acts on exactly once.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    EntryId,
    Evidence,
    GroupInfo,
    GroupName,
    Heartbeat,
    Limits,
    PendingEntry,
    PodState,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.agents import resolve_agent
from rig_conductor.policy.liveness import Fleet, is_fresh, judge_owner
from tests import reclaim_kit

NOW = datetime(2026, 11, 21, tzinfo=UTC)
SceneT = tuple[GroupInfo, list[PendingEntry], Evidence, Limits]
AGENTS = ["a", "a-b", "c", "dev-e", "dev-e-dotnet"]
CONSUMERS = [f"{agent}-{n}" for agent in AGENTS for n in range(2)] + ["stray-0", "a", "c"]

limits_st = st.builds(
    Limits,
    entry_stale_ms=st.integers(0, 10_000),
    agent_down_ms=st.integers(1, 10_000),
    max_deliveries=st.integers(1, 6),
    reclaim_degraded=st.booleans(),
    degraded_grace_ms=st.integers(0, 20_000),
    entry_deadline_ms=st.just(0),
)


def _beat(age: int, degraded: bool, run: int) -> Heartbeat:
    """A consumer's or an agent's latest heartbeat, its status `run` ms old; an agent's heard
    without naming a consumer too (`anonymous`, which a consumer's ignores)."""
    at = NOW - timedelta(milliseconds=age)
    since = at - timedelta(milliseconds=run)
    return Heartbeat(at, degraded, since, anonymous=Heartbeat(at, degraded, since))


heartbeat_st = st.builds(_beat, st.integers(0, 20_000), st.booleans(), st.integers(0, 20_000))


@st.composite
def scenes(draw: st.DrawFn) -> tuple[GroupInfo, list[PendingEntry], Evidence, Limits]:
    limits = draw(limits_st)
    members = draw(st.lists(st.sampled_from(CONSUMERS), min_size=1, max_size=8, unique=True))
    known = draw(st.frozensets(st.sampled_from(AGENTS)))
    evidence = Evidence(
        now=NOW,
        known_agents=frozenset(AgentId(a) for a in known),
        agent_heartbeats=draw(st.dictionaries(st.sampled_from(AGENTS).map(AgentId), heartbeat_st)),
        consumer_heartbeats=draw(
            st.dictionaries(st.sampled_from(members).map(ConsumerName), heartbeat_st)
        ),
        pods=draw(
            st.dictionaries(st.sampled_from(members).map(ConsumerName), st.sampled_from(PodState))
        ),
    )
    entries = [
        PendingEntry(
            EntryId(f"{i}-0"),
            ConsumerName(draw(st.sampled_from(members))),
            draw(st.integers(0, 20_000)),
            draw(st.integers(1, 8)),
        )
        for i in range(draw(st.integers(0, 30)))
    ]
    consumers = tuple(
        ConsumerInfo(
            ConsumerName(name),
            sum(1 for e in entries if e.consumer == name),
            draw(st.integers(0, 20_000)),
        )
        for name in members
    )
    group = GroupInfo(StreamKey("s"), GroupName("g"), len(entries), consumers)
    return group, entries, evidence, limits


def plan_for(
    scene: tuple[GroupInfo, list[PendingEntry], Evidence, Limits],
) -> reclaim.ReclaimPlan:
    group, entries, evidence, limits = scene
    return reclaim_kit.plan_reclaims(reclaim.assess_group(group, Fleet(evidence, limits)), entries)


def acting(scene: SceneT, consumer: str) -> bool:
    """The owner is down, or degraded-stale: the plan may act on its entries."""
    _, _, evidence, limits = scene
    fleet = Fleet(evidence, limits)
    name = ConsumerName(consumer)
    return fleet.is_down(name) or fleet.degraded_stale(name)


@settings(max_examples=400)
@given(scenes())
def test_never_targets_the_original_owner(scene: SceneT) -> None:
    for move in plan_for(scene).moves:
        assert move.to != move.entry.consumer


@settings(max_examples=400)
@given(scenes())
def test_never_targets_a_down_consumer_or_agent(scene: SceneT) -> None:
    group, _, evidence, limits = scene
    for move in plan_for(scene).moves:
        assert move.to in {c.name for c in group.consumers}
        assert not judge_owner(move.to, evidence, limits).down
        assert not Fleet(evidence, limits).degraded_stale(move.to)
        agent = resolve_agent(move.to, evidence.known_agents)
        if agent is not None:
            assert is_fresh(evidence.agent_heartbeats.get(agent), evidence.now, limits)
        assert not Fleet(evidence, limits).pod_gone(move.to)


@settings(max_examples=400)
@given(scenes())
def test_never_moves_a_fresh_entry_of_a_down_owner_without_pod_evidence(scene: SceneT) -> None:
    _, _, evidence, limits = scene
    plan = plan_for(scene)
    entries = (*(m.entry for m in plan.moves), *plan.dead_letters, *plan.no_target)
    for entry in entries:
        if judge_owner(entry.consumer, evidence, limits).down:
            assert entry.idle_ms >= limits.entry_stale_ms or Fleet(evidence, limits).pod_gone(
                entry.consumer
            )


@settings(max_examples=400)
@given(scenes())
def test_never_acts_on_entries_of_a_live_healthy_owner(scene: SceneT) -> None:
    plan = plan_for(scene)
    for entry in (*(m.entry for m in plan.moves), *plan.dead_letters, *plan.no_target):
        assert acting(scene, entry.consumer)


@settings(max_examples=400)
@given(scenes())
def test_degraded_owners_feed_healthy_targets_only(scene: SceneT) -> None:
    plan = plan_for(scene)
    degraded = {t.consumer for t in plan.assessment.targets if t.degraded}
    for move in plan.moves:
        if move.reason == "degraded":
            assert move.to not in degraded
    assert not (
        plan.assessment.left_degraded and any(not t.degraded for t in plan.assessment.targets)
    )


@settings(max_examples=400)
@given(scenes())
def test_the_spread_stays_within_one_of_the_water_level(scene: SceneT) -> None:
    """Down owners share one pool: after the moves, every target that received an entry holds
    at most one more than the least loaded target of that pool."""
    plan = plan_for(scene)
    down = [m for m in plan.moves if m.reason in ("down", "pod-gone")]
    if not down or len(down) != len(plan.moves):
        return
    pool = plan.assessment.spread().pool(ConsumerName(""), healthy_only=False)
    load = {t.consumer: t.pending for t in pool}
    for move in down:
        load[move.to] += 1
    floor = min(load.values())
    assert all(load[m.to] <= floor + 1 for m in down)


@settings(max_examples=400)
@given(scenes())
def test_every_eligible_entry_is_decided_exactly_once(scene: SceneT) -> None:
    _, entries, evidence, limits = scene
    plan = plan_for(scene)
    moved = [m.entry for m in plan.moves]
    decided = [e.id for e in (*moved, *plan.dead_letters, *plan.no_target)]
    assert len(decided) == len(set(decided))
    fleet = Fleet(evidence, limits)
    held = set(plan.assessment.left_degraded)

    def eligible(e: PendingEntry) -> bool:
        if e.consumer in held:
            return False
        if fleet.is_down(e.consumer):
            return e.idle_ms >= limits.entry_stale_ms or fleet.pod_gone(e.consumer)
        return fleet.degraded_stale(e.consumer)

    assert set(decided) == {e.id for e in entries if eligible(e)}
    for entry in moved:
        assert entry.deliveries < limits.max_deliveries
    for entry in plan.dead_letters:
        assert entry.deliveries >= limits.max_deliveries


@settings(max_examples=300)
@given(scenes())
def test_fast_down_check_agrees_with_the_verdict(scene: SceneT) -> None:
    group, _, evidence, limits = scene
    fleet = Fleet(evidence, limits)
    for info in group.consumers:
        assert fleet.is_down(info.name) == judge_owner(info.name, evidence, limits).down


@settings(max_examples=300)
@given(scenes())
def test_an_absent_pod_never_downs_a_consumer_that_heartbeats_by_name(scene: SceneT) -> None:
    group, _, evidence, limits = scene
    fleet = Fleet(evidence, limits)
    for info in group.consumers:
        own = evidence.consumer_heartbeats.get(info.name)
        if evidence.pod(info.name) is PodState.ABSENT and fleet.fresh(own):
            assert not fleet.pod_gone(info.name)


entry_st = st.builds(
    PendingEntry,
    st.integers(0, 10**6).map(lambda n: EntryId(f"{n}-0")),
    st.just(ConsumerName("a-0")),
    st.integers(0, 20_000),
    st.integers(1, 8),
)


@given(
    entries=st.lists(entry_st, max_size=40),
    min_idle=st.integers(0, 20_000),
    max_deliveries=st.integers(1, 8),
)
def test_a_rule_without_evidence_partitions_as_one_with_evidence_on_other_entries(
    entries: list[PendingEntry], min_idle: int, max_deliveries: int
) -> None:
    """A down owner's pages take the comprehension path of `partition`; evidence about entries
    not on the page (a worn count, a due or kept id) sends the same page down the per-entry loop.
    Both decide alike, in the page's order."""
    plain = reclaim.OwnerRule(ConsumerName("a-0"), AgentId("a"), "down", min_idle, max_deliveries)
    elsewhere = frozenset({EntryId("x-0")})
    for evidenced in (
        reclaim.OwnerRule(
            ConsumerName("a-0"), AgentId("a"), "down", min_idle, max_deliveries,
            worn={EntryId("x-0"): max_deliveries},
        ),
        reclaim.OwnerRule(
            ConsumerName("a-0"), AgentId("a"), "stalled", min_idle, max_deliveries,
            keep=elsewhere, due=elsewhere,
        ),
    ):  # fmt: skip
        assert plain.partition(entries) == evidenced.partition(entries)
        assert plain.partition(iter(entries)) == evidenced.partition(entries)
