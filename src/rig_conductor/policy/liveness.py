"""Who is down and who can take work: the contract's Reaper rules 3 and 5, as pure functions.

Pure: stdlib and domain only. Every age is measured against `evidence.now`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime

from rig_conductor.domain import (
    AgentId,
    ConsumerInfo,
    ConsumerName,
    Evidence,
    Heartbeat,
    Limits,
    PodState,
)
from rig_conductor.policy.agents import resolve_agent


class DownReason(enum.Enum):
    AGENT_NEVER_SEEN = "agent-never-heartbeated"
    AGENT_SILENT = "agent-heartbeat-stale"
    CONSUMER_SILENT = "consumer-heartbeat-stale"
    POD_GONE = "pod-gone"


@dataclass(frozen=True, slots=True)
class OwnerVerdict:
    """Rule 3 applied to one consumer: down when any reason holds."""

    consumer: ConsumerName
    agent: AgentId | None
    reasons: tuple[DownReason, ...]
    # The newest heartbeat that speaks for this consumer (its own, else its agent's), if any.
    last_heartbeat_at: datetime | None

    @property
    def down(self) -> bool:
        return bool(self.reasons)

    @property
    def pod_gone(self) -> bool:
        return DownReason.POD_GONE in self.reasons


@dataclass(frozen=True, slots=True)
class TargetCandidate:
    """A consumer that rule 5 allows to receive reclaimed entries, with its ranking evidence."""

    consumer: ConsumerName
    agent: AgentId | None
    degraded: bool
    # Age of the freshest sign of life: a heartbeat naming it, or its XINFO idle time.
    evidence_age_ms: int

    def rank(self) -> tuple[bool, int, str]:
        """Non-degraded before degraded, freshest evidence first, then by name for stable plans."""
        return (self.degraded, self.evidence_age_ms, self.consumer)


def age_ms(heartbeat: Heartbeat | None, now: datetime) -> int | None:
    if heartbeat is None:
        return None
    return max(0, int((now - heartbeat.at).total_seconds() * 1000))


def is_fresh(heartbeat: Heartbeat | None, now: datetime, limits: Limits) -> bool:
    age = age_ms(heartbeat, now)
    return age is not None and age < limits.agent_down_ms


def judge_owner(consumer: ConsumerName, evidence: Evidence, limits: Limits) -> OwnerVerdict:
    """Rule 3. A consumer that resolves to no known agent is judged by its own evidence only."""
    agent = resolve_agent(consumer, evidence.known_agents)
    reasons: list[DownReason] = []
    agent_beat = evidence.agent_heartbeats.get(agent) if agent is not None else None
    if agent is not None:
        if agent_beat is None:
            reasons.append(DownReason.AGENT_NEVER_SEEN)
        elif not is_fresh(agent_beat, evidence.now, limits):
            reasons.append(DownReason.AGENT_SILENT)
    own_beat = evidence.consumer_heartbeats.get(consumer)
    if own_beat is not None and not is_fresh(own_beat, evidence.now, limits):
        reasons.append(DownReason.CONSUMER_SILENT)
    if evidence.pod(consumer) is PodState.GONE:
        reasons.append(DownReason.POD_GONE)
    beats = [beat.at for beat in (own_beat, agent_beat) if beat is not None]
    return OwnerVerdict(consumer, agent, tuple(reasons), max(beats) if beats else None)


def target_candidate(
    info: ConsumerInfo, evidence: Evidence, limits: Limits
) -> TargetCandidate | None:
    """Rule 5: alive by its own evidence and not down by rule 3; else None."""
    verdict = judge_owner(info.name, evidence, limits)
    if verdict.down:
        return None
    own_beat = evidence.consumer_heartbeats.get(info.name)
    ages: list[int] = []
    own_age = age_ms(own_beat, evidence.now)
    if own_age is not None and own_age < limits.agent_down_ms:
        ages.append(own_age)
    if info.idle_ms < limits.agent_down_ms:
        ages.append(info.idle_ms)
    if evidence.pod(info.name) is PodState.LIVE:
        # A live pod proves presence, not activity: it qualifies, but ranks as the stalest sign.
        ages.append(limits.agent_down_ms)
    if not ages:
        return None
    if own_beat is not None:
        degraded = own_beat.degraded
    else:
        agent_beat = evidence.agent_heartbeats.get(verdict.agent) if verdict.agent else None
        degraded = agent_beat.degraded if agent_beat is not None else False
    return TargetCandidate(info.name, verdict.agent, degraded, min(ages))
