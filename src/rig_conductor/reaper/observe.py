"""What a scan reports besides its moves: metrics gauges and the detector's sightings.

Runs after the plan is applied, from the same facts the scan fetched. The sightings' lines and
rows are the write port's (`effects.observation`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import audits
from rig_conductor.domain import UNKNOWN_AGENT, GroupInfo
from rig_conductor.effects.port import Effects
from rig_conductor.policy import detector
from rig_conductor.policy.liveness import Fleet, age_ms

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics


class Detector:
    """Remembers the sightings of the previous scan, so each is announced once when it appears."""

    def __init__(self) -> None:
        self._current: set[tuple[str, str, str]] = set()

    def update(self, sightings: list[detector.Sighting]) -> list[detector.Sighting]:
        """Record this scan's sightings; return the ones the previous scan did not have."""
        fresh = [s for s in sightings if s.key not in self._current]
        self._current = {s.key for s in sightings}
        return fresh


async def observe(
    *,
    groups: list[GroupInfo],
    fleet: Fleet,
    engine: AsyncEngine,
    tenant: str,
    metrics: Metrics | None,
    watch: Detector | None,
    effects: Effects,
) -> int:
    """Refresh the gauges and run the detector (its new sightings recorded through `effects`,
    in a dry run too: they are what the scan saw); returns how many consumers it flags."""
    sightings = [s for group in groups for s in detector.without_heartbeat(group, fleet)]
    if watch is not None:
        await effects.sightings(watch.update(sightings))
    if metrics is not None:
        _refresh_gauges(groups, fleet, sightings, metrics=metrics)
        verdict = await audits.last_audit(engine, tenant=tenant)
        if verdict is not None:
            metrics.audit_lost.set(verdict.lost)
            metrics.audit_duplicates.set(verdict.duplicates)
            metrics.audit_finished.set(verdict.finished_at.timestamp())
    return len(sightings)


def _refresh_gauges(
    groups: list[GroupInfo],
    fleet: Fleet,
    sightings: list[detector.Sighting],
    *,
    metrics: Metrics,
) -> None:
    metrics.replace(
        metrics.pending,
        {
            (g.stream, g.name, agent or UNKNOWN_AGENT): count
            for g in groups
            for agent, count in detector.pending_by_agent(g, fleet).items()
        },
    )
    metrics.replace(
        metrics.oldest_idle,
        {
            (g.stream, g.name): g.oldest_idle_ms / 1000
            for g in groups
            if g.oldest_idle_ms is not None
        },
    )
    metrics.replace(
        metrics.group_lag, {(g.stream, g.name): g.lag for g in groups if g.lag is not None}
    )
    flagged: dict[tuple[str, ...], float] = {(g.stream, g.name): 0 for g in groups}
    for s in sightings:
        flagged[(s.stream, s.group)] += 1
    metrics.replace(metrics.without_heartbeat, flagged)
    ages: dict[tuple[str, ...], float] = {}
    up: dict[tuple[str, ...], float] = {}
    evidence = fleet.evidence
    for agent in evidence.known_agents:
        age = age_ms(evidence.agent_heartbeats.get(agent), evidence.now)
        if age is not None:
            ages[(agent,)] = age / 1000
        up[(agent,)] = 1.0 if fleet.agent_up(agent) else 0.0
    metrics.replace(metrics.heartbeat_age, ages)
    metrics.replace(metrics.agent_up, up)
    # The agents the registry forgot since the last scan: every series naming them goes.
    metrics.registry_read(evidence.known_agents)
