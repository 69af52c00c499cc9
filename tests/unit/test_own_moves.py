"""The reaper's own moves are not evidence (reaper rule 5).

An XCLAIM resets its target's idle time. A consumer whose only sign of life is an idle time the
reaper gave it must not receive entries, and with Kubernetes on, a consumer missing from a
successful pod list is a target only by a heartbeat of its own name. Otherwise two dead pods of a
live agent take turns: each scan finds the holder gone and hands its entries to the other.

Scan after scan over one fixed world (who is really alive, what Kubernetes answers), with the
evidence built as the adapters build it: no entry ever moves back to a consumer it was moved away
from as down or gone. Pure: no Redis, no database, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
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
    MoveKey,
    PendingEntry,
    PodState,
    StreamKey,
)
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from tests import reclaim_kit

START = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
STREAM, GROUP = StreamKey("rig:dispatch"), GroupName("workers")
AGENT = AgentId("review-e")
NAMES = [ConsumerName(f"review-e-{n}") for n in range(4)]
LIMITS = Limits(entry_stale_ms=1_000, agent_down_ms=60_000, entry_deadline_ms=0)
SCAN_MS = 5_000


class Pod(enum.Enum):
    """What is true of a consumer's pod (Kubernetes answers from this)."""

    RUNNING = "running"
    NOT_FOUND = "404"  # deleted: missing from lists, 404 by name
    OUTSIDE = "outside"  # no pod at all: an agent outside the cluster


@dataclass
class World:
    pods: dict[ConsumerName, Pod]
    # Seconds before START of each consumer's last heartbeat by its own name (None: never).
    own_beats: dict[ConsumerName, int | None]
    idle_ms: dict[ConsumerName, int]
    holders: dict[EntryId, ConsumerName]
    kubernetes: bool
    now: datetime = START
    moved_to: dict[MoveKey, datetime] = field(default_factory=dict)
    absent: set[ConsumerName] = field(default_factory=set)  # 404s remembered
    left: dict[EntryId, set[ConsumerName]] = field(default_factory=dict)

    def evidence(self) -> Evidence:
        pods: dict[ConsumerName, PodState] = {}
        if self.kubernetes:
            holding = set(self.holders.values())
            for name, pod in self.pods.items():
                if pod is Pod.RUNNING:
                    pods[name] = PodState.LIVE
                elif name in holding or name in self.absent:  # looked up by name: 404
                    pods[name] = PodState.ABSENT
                    self.absent.add(name)
        return Evidence(
            now=self.now,
            known_agents=frozenset({AGENT}),
            agent_heartbeats={AGENT: Heartbeat(self.now - timedelta(seconds=1))},
            consumer_heartbeats={
                name: Heartbeat(START - timedelta(seconds=age))
                for name, age in self.own_beats.items()
                if age is not None
            },
            pods=pods,
            pods_default=PodState.MISSING if self.kubernetes else PodState.UNKNOWN,
            moved_to=dict(self.moved_to),
        )

    def scan(self) -> None:
        pending = [
            PendingEntry(entry, owner, self.idle_ms[owner], 1)
            for entry, owner in sorted(self.holders.items())
        ]
        consumers = tuple(
            ConsumerInfo(name, sum(1 for h in self.holders.values() if h == name), idle)
            for name, idle in self.idle_ms.items()
        )
        group = GroupInfo(STREAM, GROUP, len(pending), consumers)
        assessment = reclaim.assess_group(group, Fleet(self.evidence(), LIMITS))
        for move in reclaim_kit.plan_reclaims(assessment, pending).moves:
            entry, owner = move.entry.id, move.entry.consumer
            assert move.to not in self.left.get(entry, set()), (
                f"{entry} moved back to {move.to}, which it had left as {move.reason}"
            )
            if self.kubernetes and self.pods[move.to] is Pod.NOT_FOUND:
                beat = self.own_beats[move.to]
                assert beat is not None, f"{entry} moved to {move.to}, whose pod is deleted"
            if move.reason in ("down", "pod-gone"):
                self.left.setdefault(entry, set()).add(owner)
            self.holders[entry] = move.to
            self.idle_ms[move.to] = 0  # the XCLAIM resets the target's idle time
            self.moved_to[(STREAM, GROUP, move.to)] = self.now
        self.now += timedelta(milliseconds=SCAN_MS)
        for name in self.idle_ms:  # nobody reads: the worst case for idle-time evidence
            self.idle_ms[name] += SCAN_MS


@st.composite
def worlds(draw: st.DrawFn) -> World:
    pods = {name: draw(st.sampled_from(Pod)) for name in NAMES}
    own_beats = {name: draw(st.none() | st.integers(0, 200)) for name in NAMES}
    idle = {name: draw(st.integers(0, 120_000)) for name in NAMES}
    entries = [EntryId(f"{n}-0") for n in range(1, draw(st.integers(1, 6)))]
    holders = {entry: draw(st.sampled_from(NAMES)) for entry in entries}
    return World(pods, own_beats, idle, holders, kubernetes=draw(st.booleans()))


@settings(max_examples=500, deadline=None)
@given(worlds())
def test_no_entry_moves_back_to_a_consumer_it_left_as_down_or_gone(world: World) -> None:
    for _ in range(30):
        world.scan()


def test_two_dead_pods_of_a_live_agent_do_not_trade_entries() -> None:
    """The reported case: both pods deleted, the agent alive through other pods, one dead pod
    holding two entries, the other with an idle time that the first move gave it."""
    a, b = NAMES[0], NAMES[1]
    world = World(
        pods={a: Pod.NOT_FOUND, b: Pod.NOT_FOUND},
        own_beats={a: None, b: None},  # the agent heartbeats for them, by its id
        idle_ms={a: 20_000, b: 100},
        holders={EntryId("1-0"): a, EntryId("2-0"): a},
        kubernetes=True,
    )
    for _ in range(30):
        world.scan()
    # b is missing from the list and was never a target: the entries never left a.
    assert set(world.holders.values()) == {a}


def test_an_idle_time_the_reaper_gave_is_no_evidence() -> None:
    """Without Kubernetes: a consumer that only ever received entries by XCLAIM has no idle
    time of its own; once it holds them and its agent's other signs are silent, nothing may
    move to it again on the strength of that idle time."""
    fleet = Fleet(
        Evidence(
            now=START,
            known_agents=frozenset({AGENT}),
            agent_heartbeats={AGENT: Heartbeat(START)},
            moved_to={(STREAM, GROUP, NAMES[1]): START - timedelta(seconds=3)},
        ),
        LIMITS,
    )
    given_by_us = ConsumerInfo(NAMES[1], 0, idle_ms=3_200)
    earned = ConsumerInfo(NAMES[1], 0, idle_ms=2_000)
    assert fleet.target(given_by_us, stream=STREAM, group=GROUP) is None
    assert fleet.target(earned, stream=STREAM, group=GROUP) is not None
    # The same consumer in another group: that group's idle time is its own.
    assert fleet.target(given_by_us, stream=STREAM, group=GroupName("other")) is not None
