"""Who is down and who can take work: reaper rules 3 and 5 (docs/rules.md), as pure functions.

Pure: stdlib and domain only. Every age is measured against `evidence.now`.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

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
from rig_conductor.policy.agents import AgentIndex
from rig_conductor.policy.blind import blind_ms, blind_spells, heard_cutoff
from rig_conductor.policy.degraded import run_start


class DownReason(enum.Enum):
    AGENT_NEVER_SEEN = "agent-never-heartbeated"
    AGENT_SILENT = "agent-heartbeat-stale"
    CONSUMER_SILENT = "consumer-heartbeat-stale"
    POD_GONE = "pod-gone"


@dataclass(frozen=True, slots=True)
class OwnerVerdict:
    """Rule 3 (docs/rules.md) applied to one consumer: down when any reason holds."""

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
    # Entries it holds in the group now (XINFO): the spread's starting load.
    pending: int = 0

    def rank(self) -> tuple[bool, int, str]:
        """Non-degraded before degraded, freshest evidence first, then by name for stable plans."""
        return (self.degraded, self.evidence_age_ms, self.consumer)


def age_ms(heartbeat: Heartbeat | None, now: datetime) -> int | None:
    if heartbeat is None:
        return None
    return max(0, int((now - heartbeat.at).total_seconds() * 1000))


def is_fresh(heartbeat: Heartbeat | None, now: datetime, limits: Limits) -> bool:
    """A heartbeat less than RIG_AGENT_DOWN_MS before `now`."""
    return heartbeat is not None and heartbeat.at > now - timedelta(
        milliseconds=limits.agent_down_ms
    )


class Fleet:
    """The evidence of one scan, with what every group asks again and again worked out once:
    each agent judged once, each consumer name resolved once, freshness as one comparison.

    Freshness is judged on heard time: the blind spells in the evidence do not count toward
    RIG_AGENT_DOWN_MS (`policy.blind`), so the cutoff moves back by their length.
    """

    def __init__(self, evidence: Evidence, limits: Limits) -> None:
        self.evidence = evidence
        self.limits = limits
        self.spells: tuple[Span, ...] = blind_spells(
            evidence.heard, now=evidence.now, slack_ms=limits.listen_slack_ms
        )
        self._cutoff = heard_cutoff(evidence.now, down_ms=limits.agent_down_ms, spells=self.spells)
        self._index = AgentIndex(evidence.known_agents)
        self._agent_of: dict[ConsumerName, AgentId | None] = {}
        self._agent_up: dict[AgentId, bool] = {}

    def adding(self, consumer_heartbeats: Mapping[ConsumerName, Heartbeat]) -> Fleet:
        """The fleet judged on its evidence with more consumers' own heartbeats
        (`Evidence.adding`), this one unchanged: a group read in full is judged on the heartbeats
        of all its consumers without touching what the other groups are judged on. Only the
        consumers' own heartbeats differ, so the agents and blind spells are not worked out
        again."""
        if not consumer_heartbeats:
            return self
        fleet = copy.copy(self)
        fleet.evidence = self.evidence.adding(consumer_heartbeats)
        fleet._agent_of = {}
        fleet._agent_up = {}
        return fleet

    @property
    def blind_ms(self) -> int:
        """Blind time inside the window that decides who is down (see `policy.blind`)."""
        return blind_ms(self.evidence.now, down_ms=self.limits.agent_down_ms, spells=self.spells)

    def fresh(self, heartbeat: Heartbeat | None) -> bool:
        """Within RIG_AGENT_DOWN_MS of heard time before `now` (`is_fresh` when not blind)."""
        return heartbeat is not None and heartbeat.at > self._cutoff

    def agent_of(self, consumer: ConsumerName) -> AgentId | None:
        try:
            return self._agent_of[consumer]
        except KeyError:
            agent = self._agent_of[consumer] = self._index.resolve(consumer)
            return agent

    def agent_up(self, agent: AgentId) -> bool:
        try:
            return self._agent_up[agent]
        except KeyError:
            up = self._agent_up[agent] = self.fresh(self.evidence.agent_heartbeats.get(agent))
            return up

    def is_down(self, consumer: ConsumerName) -> bool:
        """Rule 3, answered without building a verdict: the common case is "alive"."""
        agent = self.agent_of(consumer)
        if agent is not None and not self.agent_up(agent):
            return True
        own = self.evidence.consumer_heartbeats.get(consumer)
        if own is not None and not self.fresh(own):
            return True
        return self.pod_gone(consumer)

    def pod_gone(self, consumer: ConsumerName) -> bool:
        """Kubernetes positively reports the consumer's pod gone (rule 3). A pod absent without
        ever having been seen is gone only for a consumer that does not heartbeat by its own
        name: an agent outside the cluster has no pod to find."""
        state = self.evidence.pods.get(consumer)
        if state is PodState.ABSENT:
            return not self.fresh(self.evidence.consumer_heartbeats.get(consumer))
        return state is PodState.GONE

    def owner(self, consumer: ConsumerName) -> OwnerVerdict:
        """Rule 3 with its reasons. A consumer of no known agent is judged by its own evidence."""
        evidence = self.evidence
        agent = self.agent_of(consumer)
        reasons: list[DownReason] = []
        agent_beat = evidence.agent_heartbeats.get(agent) if agent is not None else None
        if agent is not None:
            if agent_beat is None:
                reasons.append(DownReason.AGENT_NEVER_SEEN)
            elif not self.fresh(agent_beat):
                reasons.append(DownReason.AGENT_SILENT)
        own_beat = evidence.consumer_heartbeats.get(consumer)
        if own_beat is not None and not self.fresh(own_beat):
            reasons.append(DownReason.CONSUMER_SILENT)
        if self.pod_gone(consumer):
            reasons.append(DownReason.POD_GONE)
        beats = [beat.at for beat in (own_beat, agent_beat) if beat is not None]
        return OwnerVerdict(consumer, agent, tuple(reasons), max(beats) if beats else None)

    def degraded_since(self, consumer: ConsumerName) -> datetime | None:
        """Start of the consumer's unbroken degraded run, if it is degraded now (rule 3b,
        `policy.degraded.run_start`).

        Its own heartbeats decide for a consumer that has heartbeated by name; the agent's
        heartbeats that name no consumer decide for the others.
        """
        own = self.evidence.consumer_heartbeats.get(consumer)
        agent = self.agent_of(consumer) if own is None else None
        beat = self.evidence.agent_heartbeats.get(agent) if agent is not None else None
        return run_start(own, beat)

    def degraded_stale(self, consumer: ConsumerName) -> bool:
        """Rule 3b: degraded without a break for at least RIG_DEGRADED_GRACE_MS (when on)."""
        if not self.limits.reclaim_degraded:
            return False
        since = self.degraded_since(consumer)
        grace = timedelta(milliseconds=self.limits.degraded_grace_ms)
        return since is not None and self.evidence.now - since >= grace

    def target(
        self, info: ConsumerInfo, *, stream: StreamKey, group: GroupName
    ) -> TargetCandidate | None:
        """Rule 5: alive by evidence the consumer earned itself, not down by rule 3 and not
        degraded-stale (its own entries are leaving it); else None.

        The conductor's own moves to the consumer in this group (`Evidence.moved_to`) reset its
        idle time, so an idle time that is not shorter than the time since
        that move is the conductor's own doing, not the consumer's: no evidence. With
        Kubernetes on, a consumer missing from a successful pod list qualifies only by a
        heartbeat of its own name (a dead pod's consumer would otherwise look alive by idle).
        """
        if self.is_down(info.name) or self.degraded_stale(info.name):
            return None
        evidence, limits = self.evidence, self.limits
        own_beat = evidence.consumer_heartbeats.get(info.name)
        own_fresh = self.fresh(own_beat)
        moved_at = evidence.moved_to.get((stream, group, info.name))
        pod = evidence.pod(info.name)
        if pod in (PodState.MISSING, PodState.ABSENT) and not own_fresh:
            return None
        ages: list[int] = []
        if own_fresh:
            ages.append(min(age_ms(own_beat, evidence.now) or 0, limits.agent_down_ms))
        read_at = evidence.read_at or evidence.now
        if info.idle_ms < limits.agent_down_ms and _earned(info.idle_ms, moved_at, read_at):
            ages.append(info.idle_ms)
        if pod is PodState.LIVE:
            # A live pod proves presence, not activity: it qualifies, but ranks as the stalest sign.
            ages.append(limits.agent_down_ms)
        if not ages:
            return None
        agent = self.agent_of(info.name)
        if own_beat is not None:
            degraded = own_beat.degraded
        else:
            agent_beat = evidence.agent_heartbeats.get(agent) if agent else None
            degraded = agent_beat.degraded if agent_beat is not None else False
        return TargetCandidate(info.name, agent, degraded, min(ages), info.pending)


def _earned(idle_ms: int, moved_at: datetime | None, read_at: datetime) -> bool:
    """Whether a consumer's idle time is its own: it touched the group after our last move to
    it. The move's record is written after its XCLAIM, and the idle time was read after
    `read_at`, so an untouched target's idle time is never shorter than `read_at - moved_at`."""
    if moved_at is None:
        return True
    return idle_ms < (read_at - moved_at).total_seconds() * 1000


def judge_owner(consumer: ConsumerName, evidence: Evidence, limits: Limits) -> OwnerVerdict:
    """Rule 3 (docs/rules.md) for one consumer (see `Fleet.owner`)."""
    return Fleet(evidence, limits).owner(consumer)
