"""The evidence is frozen in fact: the groups of a scan are judged side by side on it, so more
heartbeats make a new evidence (and a fleet of its own) instead of changing the one they share."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    Evidence,
    GroupName,
    Heartbeat,
    Limits,
    PodState,
    StreamKey,
)
from rig_conductor.policy.liveness import Fleet

NOW = datetime(2025, 1, 1, tzinfo=UTC)
LIMITS = Limits(entry_stale_ms=1_000, agent_down_ms=60_000)
FRESH, STALE = Heartbeat(NOW - timedelta(seconds=1)), Heartbeat(NOW - timedelta(hours=1))
OWNER, TARGET = ConsumerName("a-0"), ConsumerName("a-1")
S, G = StreamKey("s"), GroupName("g")


def evidence(**beats: Heartbeat) -> Evidence:
    """Agent `a` up; every pod missing from a successful list, so a consumer is a target by its
    own heartbeat only (rule 5, docs/rules.md)."""
    return Evidence(
        NOW,
        frozenset({AgentId("a")}),
        agent_heartbeats={AgentId("a"): FRESH},
        consumer_heartbeats={ConsumerName(c.replace("_", "-")): b for c, b in beats.items()},
        pods_default=PodState.MISSING,
    )


@pytest.mark.parametrize("field", ["agent_heartbeats", "consumer_heartbeats", "pods", "moved_to"])
def test_no_mapping_of_an_evidence_can_be_changed(field: str) -> None:
    mapping: Any = getattr(evidence(a_0=FRESH), field)
    with pytest.raises(TypeError):
        mapping["x"] = FRESH
    with pytest.raises(AttributeError):
        mapping.update({"x": FRESH})


def test_adding_heartbeats_makes_a_new_evidence_and_leaves_the_first_as_it_was() -> None:
    first = evidence(a_0=STALE)
    more = {TARGET: FRESH, OWNER: FRESH}
    second = first.adding(more)
    more[TARGET] = STALE  # the caller's mapping is not the evidence's
    assert dict(first.consumer_heartbeats) == {OWNER: STALE}
    assert dict(second.consumer_heartbeats) == {OWNER: FRESH, TARGET: FRESH}
    assert second.consumer_heartbeats.get(ConsumerName("a-9")) is None
    assert (second.now, second.agent_heartbeats) == (first.now, first.agent_heartbeats)
    assert first.adding({}) is first


def test_a_fleet_with_more_heartbeats_judges_on_them_and_the_first_fleet_does_not() -> None:
    fleet = Fleet(evidence(a_0=STALE), LIMITS)
    target = ConsumerInfo(TARGET, pending=0, idle_ms=10)
    assert fleet.target(target, stream=S, group=G) is None  # no pod, no own heartbeat
    assert fleet.is_down(OWNER)

    group = fleet.adding({TARGET: FRESH})
    assert group.target(target, stream=S, group=G) is not None
    assert group.is_down(OWNER) and group.agent_up(AgentId("a"))
    assert fleet.target(target, stream=S, group=G) is None
    assert TARGET not in fleet.evidence.consumer_heartbeats
    assert fleet.adding({}) is fleet


names = st.sampled_from([ConsumerName(f"c-{n}") for n in range(8)])
beats = st.dictionaries(names, st.builds(Heartbeat, st.sampled_from([FRESH.at, STALE.at])))


@given(top=beats, base=beats)
def test_added_heartbeats_read_as_the_two_merged(
    top: dict[ConsumerName, Heartbeat], base: dict[ConsumerName, Heartbeat]
) -> None:
    layered = replace(evidence(), consumer_heartbeats=base).adding(top).consumer_heartbeats
    merged = {**base, **top}
    assert dict(layered) == merged and len(layered) == len(merged)
    for name in [ConsumerName(f"c-{n}") for n in range(9)]:
        assert layered.get(name) == merged.get(name)
        assert layered.get(name, STALE) == merged.get(name, STALE)
        assert (name in layered) == (name in merged)
