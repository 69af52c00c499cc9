"""The reclaim decision: owner down (rule 3), stale or pod gone (rule 4), target (rule 5),
dead letters (rule 7). Pure: no Redis, no database, no clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

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
from rig_conductor.policy.liveness import DownReason, Fleet, judge_owner
from tests import reclaim_kit

NOW = datetime(2026, 5, 16, 12, 0, tzinfo=UTC)
LIMITS = Limits(entry_stale_ms=300_000, agent_down_ms=600_000, max_deliveries=5)
FRESH_S, STALE_S = 30, 900  # heartbeat ages: within / beyond agent_down_ms
FRESH_MS, STALE_MS = 1_000, 400_000  # entry idle: below / at least entry_stale_ms


def beat(age_s: float, degraded: bool = False) -> Heartbeat:
    return Heartbeat(NOW - timedelta(seconds=age_s), degraded)


@dataclass
class Scene:
    """A group of consumers with the evidence about them, written as compactly as a table row."""

    agents: dict[str, float | None] = field(
        default_factory=dict
    )  # agent -> heartbeat age (None: never)
    consumers: dict[str, int] = field(default_factory=dict)  # consumer -> XINFO idle ms
    consumer_beats: dict[str, Heartbeat] = field(default_factory=dict)
    agent_degraded: set[str] = field(default_factory=set)
    pods: dict[str, PodState] = field(default_factory=dict)
    limits: Limits = LIMITS

    def evidence(self) -> Evidence:
        return Evidence(
            now=NOW,
            known_agents=frozenset(AgentId(a) for a in self.agents),
            agent_heartbeats={
                AgentId(a): beat(age, a in self.agent_degraded)
                for a, age in self.agents.items()
                if age is not None
            },
            consumer_heartbeats={ConsumerName(c): hb for c, hb in self.consumer_beats.items()},
            pods={ConsumerName(c): state for c, state in self.pods.items()},
        )

    def plan(
        self, *entries: tuple[str, int, int], finished: frozenset[EntryId] = frozenset()
    ) -> reclaim.ReclaimPlan:
        """entries: (owner consumer, idle ms, deliveries); ids 1-0, 2-0, ... in that order.
        `finished`: entries whose accepted outputs are not published yet."""
        pending = [
            PendingEntry(EntryId(f"{i}-0"), ConsumerName(c), idle, n)
            for i, (c, idle, n) in enumerate(entries, start=1)
        ]
        counts = {c: sum(1 for e in pending if e.consumer == c) for c in self.consumers}
        group = GroupInfo(
            StreamKey("rig:dispatch"),
            GroupName("workers"),
            len(pending),
            tuple(
                ConsumerInfo(ConsumerName(c), counts[c], idle) for c, idle in self.consumers.items()
            ),
        )
        fleet = Fleet(self.evidence(), self.limits)
        assessment = reclaim.assess_group(group, fleet, finished=finished)
        return reclaim_kit.plan_reclaims(assessment, pending)


def outcome(plan: reclaim.ReclaimPlan) -> str:
    if plan.moves:
        return f"move->{plan.moves[0].to}"
    if plan.dead_letters:
        return "dead-letter"
    if plan.no_target:
        return "no-target"
    return "leave"


# The source design's ShouldReclaim table: fresh/stale entry x owner agent up/down.
@pytest.mark.parametrize(
    ("owner_age_s", "idle_ms", "expected"),
    [
        (FRESH_S, FRESH_MS, "leave"),
        (FRESH_S, STALE_MS, "leave"),
        (STALE_S, FRESH_MS, "leave"),
        (STALE_S, STALE_MS, "move->b-0"),
        (None, STALE_MS, "move->b-0"),  # never heartbeated = down
        (None, FRESH_MS, "leave"),
    ],
)
def test_reclaims_only_stale_entries_of_down_agents(
    owner_age_s: float | None, idle_ms: int, expected: str
) -> None:
    scene = Scene(agents={"a": owner_age_s, "b": FRESH_S}, consumers={"a-0": 10, "b-0": 10})
    assert outcome(scene.plan(("a-0", idle_ms, 1))) == expected


def test_thresholds_are_inclusive_and_configurable() -> None:
    limits = Limits(entry_stale_ms=5_000, agent_down_ms=60_000, max_deliveries=5)
    scene = Scene(agents={"a": 60, "b": 59}, consumers={"a-0": 0, "b-0": 0}, limits=limits)
    assert outcome(scene.plan(("a-0", 5_000, 1))) == "move->b-0"  # idle == stale: reclaim
    assert outcome(scene.plan(("a-0", 4_999, 1))) == "leave"
    scene.agents["a"] = 59.999
    assert outcome(scene.plan(("a-0", 5_000, 1))) == "leave"  # heartbeat just within the limit


@pytest.mark.parametrize(
    ("scene", "expected"),
    [
        # Exclude the original: the only consumer in the group is the dead owner.
        (Scene(agents={"a": STALE_S}, consumers={"a-0": 10}), "no-target"),
        # Skip down agents: the only other consumer belongs to a silent agent.
        (Scene(agents={"a": STALE_S, "b": STALE_S}, consumers={"a-0": 10, "b-0": 10}), "no-target"),
        # Empty candidate list beyond the owner, even with other live agents elsewhere.
        (Scene(agents={"a": STALE_S, "c": FRESH_S}, consumers={"a-0": 10}), "no-target"),
        # Prefer the freshest heartbeat.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S, "c": FRESH_S},
                consumers={"a-0": 10, "b-0": 500_000, "c-0": 500_000},
                consumer_beats={"b-0": beat(40), "c-0": beat(5)},
            ),
            "move->c-0",
        ),
        # Freshest by XINFO idle when no consumer heartbeats exist.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S}, consumers={"a-0": 1, "b-0": 9_000, "b-1": 200}
            ),
            "move->b-1",
        ),
        # Non-degraded before degraded, even when the degraded one is fresher.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S, "c": FRESH_S},
                consumers={"a-0": 10, "b-0": 100_000, "c-0": 10},
                consumer_beats={"b-0": beat(50), "c-0": beat(1, degraded=True)},
            ),
            "move->b-0",
        ),
        # Agent-level degradation counts when the consumer has no heartbeat of its own.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S, "c": FRESH_S},
                consumers={"a-0": 10, "b-0": 50_000, "c-0": 10},
                agent_degraded={"c"},
            ),
            "move->b-0",
        ),
        # Only a degraded consumer is alive: still a target.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S},
                consumers={"a-0": 10, "b-0": 10},
                agent_degraded={"b"},
            ),
            "move->b-0",
        ),
        # A consumer whose agent is up but whose XINFO idle is old and that never heartbeated
        # by name has no evidence of its own: not a target.
        (
            Scene(agents={"a": STALE_S, "b": FRESH_S}, consumers={"a-0": 1, "b-0": 700_000}),
            "no-target",
        ),
        # ... unless Kubernetes reports its pod live.
        (
            Scene(
                agents={"a": STALE_S, "b": FRESH_S},
                consumers={"a-0": 1, "b-0": 700_000},
                pods={"b-0": PodState.LIVE},
            ),
            "move->b-0",
        ),
        # A consumer of no known agent, alive by XINFO idle, is a valid target.
        (Scene(agents={"a": STALE_S}, consumers={"a-0": 1, "stray-pod": 100}), "move->stray-pod"),
        # A fresh XINFO idle does not rescue a consumer whose agent is down.
        (Scene(agents={"a": STALE_S, "b": STALE_S}, consumers={"a-0": 1, "b-0": 5}), "no-target"),
    ],
)
def test_target_selection(scene: Scene, expected: str) -> None:
    assert outcome(scene.plan(("a-0", STALE_MS, 1))) == expected


def test_dead_pod_of_a_live_agent_is_down_by_its_own_heartbeat() -> None:
    # dev-e has two pods; dev-e-0 stopped heartbeating, dev-e-1 keeps the agent fresh.
    scene = Scene(
        agents={"dev-e": FRESH_S},
        consumers={"dev-e-0": 10, "dev-e-1": 10},
        consumer_beats={"dev-e-0": beat(STALE_S), "dev-e-1": beat(FRESH_S)},
    )
    assert outcome(scene.plan(("dev-e-0", STALE_MS, 1))) == "move->dev-e-1"
    assert outcome(scene.plan(("dev-e-1", STALE_MS, 1))) == "leave"


def test_consumer_of_unknown_agent_is_judged_by_its_own_evidence() -> None:
    no_evidence = Scene(agents={"b": FRESH_S}, consumers={"stray-0": 10, "b-0": 10})
    assert outcome(no_evidence.plan(("stray-0", STALE_MS, 1))) == "leave"
    silent = Scene(
        agents={"b": FRESH_S},
        consumers={"stray-0": 10, "b-0": 10},
        consumer_beats={"stray-0": beat(STALE_S)},
    )
    assert outcome(silent.plan(("stray-0", STALE_MS, 1))) == "move->b-0"


@pytest.mark.parametrize(
    ("pod", "idle_ms", "expected"),
    [
        (PodState.GONE, FRESH_MS, "move->b-0"),  # nobody can ack it: no need to wait for staleness
        (PodState.GONE, 0, "move->b-0"),
        (PodState.UNKNOWN, STALE_MS, "leave"),  # a failed API call is never "absent"
        (PodState.LIVE, STALE_MS, "leave"),
    ],
)
def test_pod_evidence(pod: PodState, idle_ms: int, expected: str) -> None:
    scene = Scene(
        agents={"a": FRESH_S, "b": FRESH_S}, consumers={"a-0": 10, "b-0": 10}, pods={"a-0": pod}
    )
    assert outcome(scene.plan(("a-0", idle_ms, 1))) == expected


def test_min_idle_follows_pod_evidence() -> None:
    scene = Scene(
        agents={"a": STALE_S, "b": FRESH_S},
        consumers={"a-0": 10, "a-1": 10, "b-0": 10},
        pods={"a-1": PodState.GONE},
    )
    assessment = scene.plan(("a-0", STALE_MS, 1), ("a-1", 5, 1)).assessment
    assert assessment.rules[ConsumerName("a-0")].min_idle_ms == LIMITS.entry_stale_ms
    assert assessment.rules[ConsumerName("a-1")].min_idle_ms == 0


@pytest.mark.parametrize(
    ("deliveries", "has_target", "expected"),
    [
        (4, True, "move->b-0"),
        (5, True, "dead-letter"),
        (9, True, "dead-letter"),
        (5, False, "dead-letter"),  # a worn-out entry needs no target to be dead-lettered
        (4, False, "no-target"),
    ],
)
def test_dead_letters_at_max_deliveries(deliveries: int, has_target: bool, expected: str) -> None:
    consumers = {"a-0": 10, "b-0": 10} if has_target else {"a-0": 10}
    scene = Scene(agents={"a": STALE_S, "b": FRESH_S}, consumers=consumers)
    assert outcome(scene.plan(("a-0", STALE_MS, deliveries))) == expected


@pytest.mark.parametrize(
    ("deliveries", "has_target", "expected"),
    [
        (4, True, "move->b-0"),
        (5, True, "move->b-0"),
        (9, True, "move->b-0"),
        (9, False, "no-target"),
    ],
)
def test_an_entry_with_outputs_to_publish_is_moved_never_dead_lettered(
    deliveries: int, has_target: bool, expected: str
) -> None:
    """Its completion was accepted; its holder died before renaming the staged files. A dead
    letter would lose the publish (and a requeue would run it twice): it moves, however often
    it was delivered, and the next holder publishes and acks it."""
    consumers = {"a-0": 10, "b-0": 10} if has_target else {"a-0": 10}
    scene = Scene(agents={"a": STALE_S, "b": FRESH_S}, consumers=consumers)
    plan = scene.plan(("a-0", STALE_MS, deliveries), finished=frozenset({EntryId("1-0")}))
    assert outcome(plan) == expected


def test_plan_sorts_a_mixed_pending_list() -> None:
    scene = Scene(
        agents={"a": STALE_S, "b": FRESH_S},
        consumers={"a-0": 10, "b-0": 10},
    )
    plan = scene.plan(
        ("a-0", STALE_MS, 1),  # 1-0 move
        ("a-0", FRESH_MS, 1),  # 2-0 fresh: leave
        ("b-0", STALE_MS, 1),  # 3-0 live owner: leave
        ("a-0", STALE_MS, 5),  # 4-0 dead letter
        ("a-0", STALE_MS, 2),  # 5-0 move
    )
    assert [m.entry.id for m in plan.moves] == ["1-0", "5-0"]
    assert [e.id for e in plan.dead_letters] == ["4-0"]
    assert plan.no_target == ()


def test_only_consumers_holding_entries_are_judged() -> None:
    scene = Scene(agents={"a": STALE_S, "b": FRESH_S}, consumers={"a-0": 10, "a-1": 10, "b-0": 10})
    plan = scene.plan(("a-0", STALE_MS, 1))
    assert set(plan.assessment.down) == {"a-0"}


def test_down_reasons_are_all_reported() -> None:
    scene = Scene(
        agents={"a": STALE_S},
        consumers={"a-0": 10},
        consumer_beats={"a-0": beat(STALE_S)},
        pods={"a-0": PodState.GONE},
    )
    verdict = judge_owner(ConsumerName("a-0"), scene.evidence(), LIMITS)
    assert verdict.reasons == (
        DownReason.AGENT_SILENT,
        DownReason.CONSUMER_SILENT,
        DownReason.POD_GONE,
    )
    assert verdict.last_heartbeat_at == NOW - timedelta(seconds=STALE_S)


@pytest.mark.parametrize(
    ("deliveries", "attempts", "expected", "count"),
    [
        (2, 5, "dead-letter", 5),  # the recorded attempts are the truer count
        (5, 2, "dead-letter", 5),  # crashes before WORK_STARTED still count as deliveries
        (2, 4, "move->b-0", None),
        (2, None, "move->b-0", None),
    ],
)
def test_dead_letter_uses_the_truer_count(
    deliveries: int, attempts: int | None, expected: str, count: int | None
) -> None:
    scene = Scene(agents={"a": STALE_S, "b": FRESH_S}, consumers={"a-0": 10, "b-0": 10})
    pending = [PendingEntry(EntryId("1-0"), ConsumerName("a-0"), STALE_MS, deliveries)]
    group = GroupInfo(
        StreamKey("rig:dispatch"),
        GroupName("workers"),
        1,
        (ConsumerInfo(ConsumerName("a-0"), 1, 10), ConsumerInfo(ConsumerName("b-0"), 0, 10)),
    )
    recorded = {EntryId("1-0"): attempts} if attempts is not None else {}
    assessment = reclaim.assess_group(group, Fleet(scene.evidence(), LIMITS), attempts=recorded)
    plan = reclaim_kit.plan_reclaims(assessment, pending)
    assert outcome(plan) == expected
    if count is not None:
        assert plan.dead_letters[0].deliveries == count
