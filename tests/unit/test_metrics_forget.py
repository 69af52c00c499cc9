"""Metric series of forgotten agents: every family labelled by agent drops them, on the replica
that scans (the registry forgot them) and on every other (not heard of for
RIG_AGENT_FORGET_MS)."""

from __future__ import annotations

from prometheus_client import generate_latest

from rig_conductor.metrics import UNKNOWN_AGENT, Metrics

DAY = 86_400.0


def agents_named(metrics: Metrics) -> set[str]:
    text = generate_latest(metrics.registry).decode()
    named = set()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        for label in ("agent", "from_agent", "to_agent"):
            marker = f'{label}="'
            if marker in line:
                named.add(line.split(marker, 1)[1].split('"', 1)[0])
    return named


def with_series(metrics: Metrics, agent: str, *, at: float) -> None:
    metrics.heartbeats_stored([agent], at=at)
    metrics.pending.labels("rig:dispatch", "g", agent).set(3)
    metrics.reclaimed.labels("rig:dispatch", "g", agent, UNKNOWN_AGENT, "down").inc()
    metrics.reclaimed.labels("rig:dispatch", "g", "other-e", agent, "down").inc()


def test_a_replica_drops_the_series_of_agents_it_has_not_heard_of() -> None:
    metrics = Metrics()
    with_series(metrics, "old-e", at=0)
    with_series(metrics, "new-e", at=8 * DAY)
    gone = metrics.forget_silent(before=1 * DAY, keep=set(), now=8 * DAY)
    assert gone == {"old-e"}
    # other-e was named only beside old-e: its clock starts now, its series went with old-e's.
    assert agents_named(metrics) == {"new-e", "other-e", UNKNOWN_AGENT}
    assert metrics.forget_silent(before=1 * DAY, keep=set(), now=8 * DAY) == set()


def test_configured_agents_keep_their_series() -> None:
    metrics = Metrics()
    with_series(metrics, "dev-e", at=0)
    assert metrics.forget_silent(before=1 * DAY, keep={"dev-e"}, now=8 * DAY) == set()
    assert "dev-e" in agents_named(metrics)


def test_an_agent_the_registry_forgot_loses_its_series_at_the_next_scan() -> None:
    metrics = Metrics()
    with_series(metrics, "old-e", at=0)
    with_series(metrics, "new-e", at=0)
    assert metrics.registry_read({"old-e", "new-e"}, at=1) == set()
    assert metrics.registry_read({"new-e"}, at=2) == {"old-e"}
    assert "old-e" not in agents_named(metrics)
    assert "new-e" in agents_named(metrics)
    # Seen by the scan just now: not silent on this replica.
    assert metrics.forget_silent(before=1.5, keep=set(), now=3) == set()
