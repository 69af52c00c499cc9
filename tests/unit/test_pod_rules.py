"""Pod-state rules (reaper rules 3-4) as tables over the pure functions: no Kubernetes."""

from __future__ import annotations

import itertools

import pytest

from rig_conductor.domain import PodState
from rig_conductor.policy.pods import event_state, pod_state, safer

LIVE, UNKNOWN, GONE = PodState.LIVE, PodState.UNKNOWN, PodState.GONE


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("Pending", LIVE),
        ("Running", LIVE),  # also while terminating: its containers may still ack
        ("Succeeded", GONE),
        ("Failed", GONE),
        ("Unknown", UNKNOWN),  # the node stopped reporting
        ("", UNKNOWN),  # the API sent no status yet
        ("running", UNKNOWN),  # phases are matched exactly
    ],
)
def test_pod_state_by_phase(phase: str, expected: PodState) -> None:
    assert pod_state(phase) is expected


@pytest.mark.parametrize(
    ("event_type", "phase", "expected"),
    [
        ("ADDED", "Pending", LIVE),
        ("MODIFIED", "Running", LIVE),
        ("MODIFIED", "Succeeded", GONE),
        ("MODIFIED", "Unknown", UNKNOWN),
        ("DELETED", "Running", GONE),  # deleted is gone, whatever its last phase
        ("DELETED", "", GONE),
    ],
)
def test_event_state(event_type: str, phase: str, expected: PodState) -> None:
    assert event_state(event_type, phase) is expected


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (LIVE, LIVE, LIVE),
        (LIVE, UNKNOWN, LIVE),
        (LIVE, GONE, LIVE),
        (UNKNOWN, LIVE, LIVE),
        (UNKNOWN, UNKNOWN, UNKNOWN),
        (UNKNOWN, GONE, UNKNOWN),
        (GONE, LIVE, LIVE),
        (GONE, UNKNOWN, UNKNOWN),
        (GONE, GONE, GONE),
    ],
)
def test_the_answer_that_moves_less_work_wins(
    first: PodState, second: PodState, expected: PodState
) -> None:
    assert safer(first, second) is expected


def test_safer_does_not_depend_on_the_order() -> None:
    for first, second in itertools.product((LIVE, UNKNOWN, GONE), repeat=2):
        assert safer(first, second) is safer(second, first)
