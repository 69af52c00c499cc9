"""Rule 3b's run start (docs/rules.md), decided by `policy.degraded.run_start` from the facts the
heartbeat tables keep. Pure: no database, no clock.

Each case is a history of heartbeat batches turned into those facts as the intake records them
(`heard`, below: per voice, the latest `degraded` and since when every heartbeat of the voice
has reported it), and the run start policy decides for one consumer from them.
`tests/integration/test_degraded_and_stalled.py` checks that PostgreSQL records the same facts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from rig_conductor.domain import AgentId, ConsumerName, Evidence, Heartbeat, Limits
from rig_conductor.policy import degraded
from rig_conductor.policy.liveness import Fleet

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
AGENT = "review-e-codex"
NAMED, UNNAMED, SIBLING = "review-e-codex-0", "review-e-codex-1", "review-e-codex-2"
# What a beat says: healthy or degraded. A beat names a consumer, or None (the agent's own).
OK, SICK = False, True

Beat = tuple[str | None, bool]


@dataclass(frozen=True)
class Batch:
    """Heartbeats received together, `at_s` seconds after T0: all share that receipt time."""

    at_s: int
    beats: Sequence[Beat]


def t(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def heard(history: Sequence[Batch]) -> tuple[dict[str, Heartbeat], Heartbeat | None]:
    """The facts the intake keeps after `history`: each consumer's own latest heartbeat, and the
    agent's (any kind) with its latest naming no consumer as `anonymous`."""
    own: dict[str, Heartbeat] = {}
    agent: Heartbeat | None = None
    anonymous: Heartbeat | None = None

    def said(before: Heartbeat | None, at: datetime, flags: list[bool]) -> Heartbeat:
        last = flags[-1]
        steady = before is not None and before.degraded == last and set(flags) == {last}
        since = before.status_since if steady and before is not None else at
        return Heartbeat(at, last, since)

    for batch in history:
        at = t(batch.at_s)
        for consumer in dict.fromkeys(c for c, _ in batch.beats if c is not None):
            flags = [d for c, d in batch.beats if c == consumer]
            own[consumer] = said(own.get(consumer), at, flags)
        anonymous_flags = [d for c, d in batch.beats if c is None]
        if anonymous_flags:
            anonymous = said(anonymous, at, anonymous_flags)
        agent = Heartbeat(at, batch.beats[-1][1], anonymous=anonymous)
    return own, agent


def run_start(history: Sequence[Batch], consumer: str) -> datetime | None:
    own, agent = heard(history)
    return degraded.run_start(own.get(consumer), agent)


CASES = [
    # (why, history, consumer asking, run start: seconds after T0, or None)
    ("nothing heard: no run", [], NAMED, None),
    ("healthy: no run", [Batch(0, [(NAMED, OK)])], NAMED, None),
    ("a degraded heartbeat starts a run", [Batch(0, [(NAMED, SICK)])], NAMED, 0),
    (
        "degraded heartbeats keep the run's start",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(NAMED, SICK)]), Batch(60, [(NAMED, SICK)])],
        NAMED,
        0,
    ),
    (
        "a healthy heartbeat breaks it: the run starts again at the next degraded one",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(NAMED, OK)]), Batch(60, [(NAMED, SICK)])],
        NAMED,
        60,
    ),
    (
        "a healthy heartbeat ends it",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(NAMED, OK)])],
        NAMED,
        None,
    ),
    (
        "healthy and degraded again within one batch: the run starts at that batch",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(NAMED, SICK), (NAMED, OK), (NAMED, SICK)])],
        NAMED,
        30,
    ),
    (
        "degraded and healthy within one batch: no run",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(NAMED, SICK), (NAMED, OK)])],
        NAMED,
        None,
    ),
    (
        "a silence longer than RIG_AGENT_DOWN_MS (it ends the liveness interval) keeps the run:"
        " every heartbeat was degraded",
        [Batch(0, [(NAMED, SICK)]), Batch(3_600, [(NAMED, SICK)])],
        NAMED,
        0,
    ),
    (
        "a silence, then healthy, then degraded: the run starts after the healthy heartbeat",
        [Batch(0, [(NAMED, SICK)]), Batch(3_600, [(NAMED, OK)]), Batch(3_630, [(NAMED, SICK)])],
        NAMED,
        3_630,
    ),
    # Which heartbeats speak for a consumer.
    (
        "its own heartbeats decide for a consumer heartbeating by name: healthy",
        [Batch(0, [(None, SICK), (NAMED, OK)])],
        NAMED,
        None,
    ),
    (
        "its own heartbeats decide for a consumer heartbeating by name: degraded",
        [Batch(0, [(None, OK), (NAMED, SICK)]), Batch(30, [(None, OK), (NAMED, SICK)])],
        NAMED,
        0,
    ),
    (
        "the agent's heartbeats naming no consumer do not break a consumer's run",
        [Batch(0, [(NAMED, SICK)]), Batch(30, [(None, OK)]), Batch(60, [(NAMED, SICK)])],
        NAMED,
        0,
    ),
    (
        "the agent's heartbeats naming no consumer decide for one that never heartbeats by name",
        [Batch(0, [(None, SICK)]), Batch(30, [(None, SICK)])],
        UNNAMED,
        0,
    ),
    (
        "the agent's run is broken by its own healthy heartbeat naming no consumer",
        [Batch(0, [(None, SICK)]), Batch(30, [(None, OK)]), Batch(60, [(None, SICK)])],
        UNNAMED,
        60,
    ),
    (
        "the agent's run is not broken by its consumers heartbeating healthy by name",
        [Batch(0, [(None, SICK)]), Batch(30, [(SIBLING, OK)]), Batch(60, [(None, SICK)])],
        UNNAMED,
        0,
    ),
    (
        "the agent's run survives a silence of its heartbeats naming no consumer",
        [Batch(0, [(None, SICK)]), Batch(30, [(SIBLING, OK)]), Batch(3_600, [(None, SICK)])],
        UNNAMED,
        0,
    ),
    (
        "nor is it started by its consumers heartbeating degraded by name",
        [Batch(0, [(None, OK)]), Batch(30, [(SIBLING, SICK)])],
        UNNAMED,
        None,
    ),
    (
        "an agent heard only through its consumers' names has no run to lend",
        [Batch(0, [(SIBLING, SICK)]), Batch(30, [(SIBLING, SICK)])],
        UNNAMED,
        None,
    ),
    (
        "a flap of the agent's heartbeats within one batch restarts its run",
        [Batch(0, [(None, SICK)]), Batch(30, [(None, OK), (SIBLING, OK), (None, SICK)])],
        UNNAMED,
        30,
    ),
]


@pytest.mark.parametrize(
    ("history", "consumer", "expected"),
    [pytest.param(h, c, e, id=why) for why, h, c, e in CASES],
)
def test_degraded_run_table(history: list[Batch], consumer: str, expected: int | None) -> None:
    assert run_start(history, consumer) == (None if expected is None else t(expected))


def test_a_run_whose_start_is_not_known_is_no_run() -> None:
    # A degraded row without its status's start (written outside the intake): never stale.
    assert degraded.run_start(Heartbeat(t(0), True), None) is None
    assert degraded.run_start(None, Heartbeat(t(0), True, anonymous=Heartbeat(t(0), True))) is None


def test_the_voice_is_the_consumers_own_else_the_agents_naming_no_consumer() -> None:
    own = Heartbeat(t(0), False, t(0))
    anonymous = Heartbeat(t(0), True, t(0))
    agent = Heartbeat(t(0), True, anonymous=anonymous)
    assert degraded.voice(own, agent) is own
    assert degraded.voice(None, agent) is anonymous
    assert degraded.voice(None, Heartbeat(t(0), True)) is None
    assert degraded.voice(None, None) is None


@pytest.mark.parametrize(
    ("run_s", "stale"),
    [(299, False), (300, True), (3_600, True)],
)
def test_the_fleet_judges_the_run_against_the_grace(run_s: int, stale: bool) -> None:
    # RIG_DEGRADED_GRACE_MS of 300 s; a consumer by name, and one its agent speaks for.
    history = [Batch(0, [(None, SICK), (NAMED, SICK)]), Batch(run_s, [(None, SICK), (NAMED, SICK)])]
    own, agent = heard(history)
    assert agent is not None
    evidence = Evidence(
        now=t(run_s),
        known_agents=frozenset({AgentId(AGENT)}),
        agent_heartbeats={AgentId(AGENT): agent},
        consumer_heartbeats={ConsumerName(c): hb for c, hb in own.items()},
    )
    fleet = Fleet(evidence, Limits(degraded_grace_ms=300_000))
    assert fleet.degraded_since(ConsumerName(NAMED)) == fleet.degraded_since(ConsumerName(UNNAMED))
    assert fleet.degraded_since(ConsumerName(NAMED)) == t(0)
    assert fleet.degraded_stale(ConsumerName(NAMED)) is stale
    assert fleet.degraded_stale(ConsumerName(UNNAMED)) is stale
