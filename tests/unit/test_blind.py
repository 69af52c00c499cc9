"""Blind spells (reaper rule 3): time no conductor could hear does not count as silence.

Table tests of `policy.blind` and of the verdicts built on it. Pure: no database, no clock; every
time is an offset in seconds from NOW.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    Evidence,
    GroupName,
    Heartbeat,
    Limits,
    PodState,
    Span,
    StreamKey,
)
from rig_conductor.policy.blind import blind_ms, blind_spells, heard_cutoff
from rig_conductor.policy.liveness import DownReason, Fleet

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
SLACK_MS = 5_000
DOWN_MS = 600_000  # 600 s
LIMITS = Limits(agent_down_ms=DOWN_MS, entry_stale_ms=0, listen_slack_ms=SLACK_MS)


def at(offset_s: float) -> datetime:
    return NOW + timedelta(seconds=offset_s)


def spans(*pairs: tuple[float, float]) -> tuple[Span, ...]:
    return tuple(Span(at(start), at(end)) for start, end in pairs)


@pytest.mark.parametrize(
    ("heard", "expected"),
    [
        pytest.param((), (), id="no-listening-history: nothing is blind"),
        pytest.param(((-3600, 0),), (), id="one replica listening all along"),
        pytest.param(((-3600, -2),), (), id="a last mark within the slack is still listening"),
        pytest.param(((-3600, -60),), ((-55, 0),), id="every replica stopped: blind until now"),
        pytest.param(((-3600, -900), (-300, 0)), ((-895, -300),), id="stopped and started again"),
        pytest.param(((-3600, -900), (-898, 0)), (), id="a gap shorter than the slack is no spell"),
        pytest.param(
            ((-3600, -900), (-1000, -100), (-100, 0)),
            (),
            id="replicas overlap: one listening is enough",
        ),
        pytest.param(((-300, 0), (-3600, -900)), ((-895, -300),), id="spans in any order"),
        pytest.param(
            ((-3600, -2000), (-1500, -1000), (-400, -100)),
            ((-1995, -1500), (-995, -400), (-95, 0)),
            id="several spells",
        ),
    ],
)
def test_blind_spells_are_the_gaps_between_listening_spans(
    heard: tuple[tuple[float, float], ...], expected: tuple[tuple[float, float], ...]
) -> None:
    assert blind_spells(spans(*heard), now=NOW, slack_ms=SLACK_MS) == spans(*expected)


@pytest.mark.parametrize(
    ("spells", "cutoff_s"),
    [
        pytest.param((), -600, id="no spell: RIG_AGENT_DOWN_MS before now"),
        pytest.param(((-1000, -700),), -600, id="a spell before the window changes nothing"),
        pytest.param(((-300, -100),), -800, id="a spell inside the window moves it back"),
        pytest.param(((-300, 0),), -900, id="a spell still going on moves it back"),
        pytest.param(
            ((-900, -750), (-300, -100)),
            -950,
            id="moving back pulls in an older spell",
        ),
        pytest.param(((-5000, 0),), -5600, id="a spell longer than the window"),
        pytest.param(((-700, -500), (-650, -550)), -800, id="overlapping spells count once"),
    ],
)
def test_heard_cutoff_skips_blind_time(
    spells: tuple[tuple[float, float], ...], cutoff_s: float
) -> None:
    found = heard_cutoff(NOW, down_ms=DOWN_MS, spells=spans(*spells))
    assert found == at(cutoff_s)
    assert blind_ms(NOW, down_ms=DOWN_MS, spells=spans(*spells)) == round((-600 - cutoff_s) * 1000)


def evidence(
    heard: tuple[Span, ...],
    *,
    agent_beat_s: float | None = None,
    consumer_beat_s: float | None = None,
    pods: dict[str, PodState] | None = None,
) -> Evidence:
    agent = AgentId("review-e")
    consumer = ConsumerName("review-e-0")
    return Evidence(
        now=NOW,
        known_agents=frozenset({agent}),
        agent_heartbeats={} if agent_beat_s is None else {agent: Heartbeat(at(agent_beat_s))},
        consumer_heartbeats=(
            {} if consumer_beat_s is None else {consumer: Heartbeat(at(consumer_beat_s))}
        ),
        pods={ConsumerName(c): s for c, s in (pods or {}).items()},
        heard=heard,
    )


# Conductors listened for an hour, then every replica was stopped (or PostgreSQL was down) for
# 15 minutes, and they have been listening again for the last 30 s.
OUTAGE = spans((-3600, -930), (-30, 0))


@pytest.mark.parametrize(
    ("heard", "agent_beat_s", "consumer_beat_s", "pods", "reasons"),
    [
        pytest.param(
            (),
            -940,
            -940,
            {},
            {DownReason.AGENT_SILENT, DownReason.CONSUMER_SILENT},
            id="without the listening record, 940 s of silence is down",
        ),
        pytest.param(
            OUTAGE,
            -940,
            -940,
            {},
            set(),
            id="an agent heard 10 s before the outage is not down 30 s after it",
        ),
        pytest.param(
            OUTAGE,
            -1500,
            None,
            {},
            {DownReason.AGENT_SILENT},
            id="an agent silent 570 s before the outage: heard silence 600 s, down",
        ),
        pytest.param(
            OUTAGE,
            -1400,
            None,
            {},
            set(),
            id="an agent silent 470 s before the outage: heard silence 500 s, not yet",
        ),
        pytest.param(
            OUTAGE,
            -940,
            None,
            {"review-e-0": PodState.GONE},
            {DownReason.POD_GONE},
            id="a pod gone still acts at once",
        ),
        pytest.param(
            OUTAGE,
            None,
            None,
            {},
            {DownReason.AGENT_NEVER_SEEN},
            id="an agent that never heartbeated is down whatever the spells",
        ),
    ],
)
def test_owner_verdicts_discount_blind_time(
    heard: tuple[Span, ...],
    agent_beat_s: float | None,
    consumer_beat_s: float | None,
    pods: dict[str, PodState],
    reasons: set[DownReason],
) -> None:
    fleet = Fleet(
        evidence(heard, agent_beat_s=agent_beat_s, consumer_beat_s=consumer_beat_s, pods=pods),
        LIMITS,
    )
    verdict = fleet.owner(ConsumerName("review-e-0"))
    assert set(verdict.reasons) == reasons
    assert fleet.is_down(ConsumerName("review-e-0")) is bool(reasons)


def test_the_blind_window_is_reported() -> None:
    fleet = Fleet(evidence(OUTAGE, agent_beat_s=-10), LIMITS)
    # 900 s of blind time (less the 5 s slack after the last mark) inside the window.
    assert fleet.blind_ms == 895_000
    assert Fleet(evidence((), agent_beat_s=-10), LIMITS).blind_ms == 0


def test_a_target_qualifies_by_its_own_heartbeat_across_a_spell() -> None:
    """A consumer that heartbeated by name just before the outage is still a target after it:
    its silence during the spell was the conductor's deafness."""
    fleet = Fleet(evidence(OUTAGE, agent_beat_s=-5, consumer_beat_s=-940), LIMITS)
    info = ConsumerInfo(ConsumerName("review-e-0"), 0, idle_ms=DOWN_MS * 2)
    candidate = fleet.target(info, stream=StreamKey("s"), group=GroupName("g"))
    assert candidate is not None
