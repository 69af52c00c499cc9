"""Properties of the reclaim plan over arbitrary fleets (hypothesis).

Whatever the evidence: never target an entry's own owner, never a consumer that is down or
whose agent is down, never move a fresh entry without pod evidence, never touch an entry whose
owner is alive, and account for every entry it acts on exactly once.
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

NOW = datetime(2026, 11, 21, tzinfo=UTC)
SceneT = tuple[GroupInfo, list[PendingEntry], Evidence, Limits]
AGENTS = ["a", "a-b", "c", "dev-e", "dev-e-dotnet"]
CONSUMERS = [f"{agent}-{n}" for agent in AGENTS for n in range(2)] + ["stray-0", "a", "c"]

limits_st = st.builds(
    Limits,
    entry_stale_ms=st.integers(0, 10_000),
    agent_down_ms=st.integers(1, 10_000),
    max_deliveries=st.integers(1, 6),
)
heartbeat_st = st.builds(
    lambda age, degraded: Heartbeat(NOW - timedelta(milliseconds=age), degraded),
    st.integers(0, 20_000),
    st.booleans(),
)


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
    return reclaim.plan_reclaims(
        reclaim.assess_group(group, Fleet(evidence, limits)), entries, limits
    )


@settings(max_examples=400)
@given(scenes())
def test_never_targets_the_original_owner(scene: SceneT) -> None:
    plan = plan_for(scene)
    for entry in plan.moves:
        assert plan.assessment.target is not None
        assert plan.assessment.target.consumer != entry.consumer


@settings(max_examples=400)
@given(scenes())
def test_never_targets_a_down_consumer_or_agent(scene: SceneT) -> None:
    group, _, evidence, limits = scene
    target = plan_for(scene).assessment.target
    if target is None:
        return
    assert target.consumer in {c.name for c in group.consumers}
    assert not judge_owner(target.consumer, evidence, limits).down
    agent = resolve_agent(target.consumer, evidence.known_agents)
    if agent is not None:
        assert is_fresh(evidence.agent_heartbeats.get(agent), evidence.now, limits)
    assert evidence.pod(target.consumer) is not PodState.GONE


@settings(max_examples=400)
@given(scenes())
def test_never_moves_a_fresh_entry_without_pod_evidence(scene: SceneT) -> None:
    _, _, evidence, limits = scene
    plan = plan_for(scene)
    for entry in (*plan.moves, *plan.dead_letters, *plan.no_target):
        assert (
            entry.idle_ms >= limits.entry_stale_ms or evidence.pod(entry.consumer) is PodState.GONE
        )


@settings(max_examples=400)
@given(scenes())
def test_never_acts_on_entries_of_a_live_owner(scene: SceneT) -> None:
    _, _, evidence, limits = scene
    plan = plan_for(scene)
    for entry in (*plan.moves, *plan.dead_letters, *plan.no_target):
        assert judge_owner(entry.consumer, evidence, limits).down


@settings(max_examples=400)
@given(scenes())
def test_every_eligible_entry_is_decided_exactly_once(scene: SceneT) -> None:
    _, entries, evidence, limits = scene
    plan = plan_for(scene)
    decided = [e.id for e in (*plan.moves, *plan.dead_letters, *plan.no_target)]
    assert len(decided) == len(set(decided))
    eligible = {
        e.id
        for e in entries
        if judge_owner(e.consumer, evidence, limits).down
        and (e.idle_ms >= limits.entry_stale_ms or evidence.pod(e.consumer) is PodState.GONE)
    }
    assert set(decided) == eligible
    for entry in plan.moves:
        assert entry.deliveries < limits.max_deliveries
    for entry in plan.dead_letters:
        assert entry.deliveries >= limits.max_deliveries
    assert not (plan.no_target and plan.assessment.target is not None)


@settings(max_examples=300)
@given(scenes())
def test_fast_down_check_agrees_with_the_verdict(scene: SceneT) -> None:
    group, _, evidence, limits = scene
    fleet = Fleet(evidence, limits)
    for info in group.consumers:
        assert fleet.is_down(info.name) == judge_owner(info.name, evidence, limits).down
