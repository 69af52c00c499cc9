"""Prometheus metrics: the contract's families, on one registry per app.

Every family exists from start-up (labelled ones with no samples yet). Label values are bounded:
stream, group and agent ids, never entry ids or pod names. A consumer that resolves to no known
agent is counted under agent="unknown".
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence, Set

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rig_conductor import build
from rig_conductor.domain import UNKNOWN_AGENT

__all__ = ["UNKNOWN_AGENT", "Metrics"]
# Scans run from milliseconds (a quiet fleet) to about a minute (a million-entry reclaim).
SCAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# One attempt's work, and how long an entry sat idle before it moved: seconds to a day.
WORK_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    21600.0,
    86400.0,
)
# What `rig_work_finished_total` counts a finished attempt as.
WORK_OUTCOMES = ("completed", "failed", "fenced", "abandoned")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._reaper_families(self.registry)
        self._fleet_families(self.registry)
        self._audit_families(self.registry)
        self.build_info = Gauge(
            "rig_build_info",
            "1, labelled with the running build's version and the git commit it was built from",
            ["version", "revision"],
            registry=self.registry,
        )
        self.build_info.labels(build.__version__, build.revision()).set(1)
        self._work_families(self.registry)
        for outcome in ("ok", "error"):
            self.scans.labels(outcome)
        self._label_sets: dict[Gauge, set[tuple[str, ...]]] = {}
        # When this replica last heard of each agent (epoch seconds): a heartbeat it stored,
        # or the last heartbeat a scan read. `forget_silent` goes by it.
        self._heard: dict[str, float] = {}
        # The agents the last scan found in the registry (`registry_read`).
        self._registry: set[str] = set()
        # The families labelled by agent: their label names, and which of them name agents.
        self._by_agent: tuple[tuple[Counter | Gauge, tuple[str, ...], tuple[str, ...]], ...] = (
            (self.heartbeat_age, ("agent",), ("agent",)),
            (self.agent_up, ("agent",), ("agent",)),
            (self.pending, ("stream", "group", "agent"), ("agent",)),
            (
                self.reclaimed,
                ("stream", "group", "from_agent", "to_agent", "reason"),
                ("from_agent", "to_agent"),
            ),
        )

    def _reaper_families(self, r: CollectorRegistry) -> None:
        """What the scans do and find: moves, dead letters, scans, pending entries."""
        self.reclaimed = Counter(
            "rig_reclaimed_entries",
            "Pending entries moved from a down, degraded or stalled owner to a live consumer",
            ["stream", "group", "from_agent", "to_agent", "reason"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "rig_dead_lettered_entries",
            "Entries copied to <stream>:dlq and acked after too many deliveries",
            ["stream", "group"],
            registry=r,
        )
        self.no_target = Counter(
            "rig_reclaim_no_target",
            "Reclaimable entries left in place: no live consumer in the group",
            ["stream", "group"],
            registry=r,
        )
        self.scans = Counter("rig_reaper_scans", "Reaper scans by outcome", ["outcome"], registry=r)
        self.node_errors = Counter(
            "rig_reaper_node_errors",
            "Scans that left out a Redis Cluster node it could not read or act on",
            ["node"],
            registry=r,
        )
        self.scan_duration = Histogram(
            "rig_reaper_scan_duration_seconds",
            "Duration of reaper scans",
            buckets=SCAN_BUCKETS,
            registry=r,
        )
        self.pending = Gauge(
            "rig_pending_entries",
            "Pending entries per stream, group and owning agent (last scan)",
            ["stream", "group", "agent"],
            registry=r,
        )
        self.oldest_idle = Gauge(
            "rig_pending_oldest_idle_seconds",
            "Idle time of the oldest pending entry of a group",
            ["stream", "group"],
            registry=r,
        )

    def _fleet_families(self, r: CollectorRegistry) -> None:
        """The agents, their heartbeats and dispatches, and the conductor's own blind spells
        and Redis data losses."""
        self.heartbeat_age = Gauge(
            "rig_agent_heartbeat_age_seconds",
            "Seconds since the agent's last heartbeat",
            ["agent"],
            registry=r,
        )
        self.agent_up = Gauge(
            "rig_agent_up",
            "1 while the agent heartbeats within RIG_AGENT_DOWN_MS",
            ["agent"],
            registry=r,
        )
        self.without_heartbeat = Gauge(
            "rig_stream_consumers_without_heartbeat",
            "Consumers holding pending entries with no fresh heartbeat (the detector)",
            ["stream", "group"],
            registry=r,
        )
        self.heartbeats = Counter("rig_heartbeats_received", "Heartbeats accepted", registry=r)
        self.legacy_events = Counter(
            "rig_legacy_events",
            "WORK_* events that named no group (agents of the previous release), by type",
            ["type"],
            registry=r,
        )
        self.dispatched = Counter(
            "rig_dispatched_entries", "ISSUE_ASSIGNED entries appended", ["stream"], registry=r
        )
        # Blind spells (reaper rule 3, docs/rules.md): time no conductor could take heartbeats in.
        self.blind_spells = Counter(
            "rig_blind_seconds",
            "Seconds of blind spells this replica saw end: no conductor sharing the database "
            "could take heartbeats in (every replica stopped, PostgreSQL unreachable, heartbeat "
            "writes failing); that time does not count toward RIG_AGENT_DOWN_MS",
            registry=r,
        )
        self.blind_window = Gauge(
            "rig_reaper_blind_seconds",
            "Blind time inside the window the last scan judged silence by: how much later "
            "than RIG_AGENT_DOWN_MS a silent agent counts as down right now",
            registry=r,
        )
        self.redispatched = Counter(
            "rig_redispatched_entries",
            "Dispatches Redis had lost, appended again from PostgreSQL: `lost` by the per-scan "
            "check of recent unstarted ones, `redis-data-loss` after Redis lost its data",
            ["stream", "reason"],
            registry=r,
        )
        self.redis_data_losses = Counter(
            "rig_redis_data_losses",
            "Times a scan found that Redis had lost its data (the epoch marker beside the "
            "stream was gone): restarted without persistence, flushed, or failed over empty",
            ["stream"],
            registry=r,
        )

    def _work_families(self, r: CollectorRegistry) -> None:
        """The work itself: attempts finished and how long they took, each group's backlog,
        and how long entries sat idle before the reaper (or an operator) moved them."""
        self.work_finished = Counter(
            "rig_work_finished",
            "Attempts that reported their end: completed, failed, fenced (a report of an "
            "attempt no longer current) or abandoned (no progress within the deadline)",
            ["stream", "group", "outcome"],
            registry=r,
        )
        self.work_duration = Histogram(
            "rig_work_duration_seconds",
            "From WORK_STARTED to the accepted WORK_COMPLETED of one attempt",
            ["stream", "group"],
            buckets=WORK_BUCKETS,
            registry=r,
        )
        self.group_lag = Gauge(
            "rig_stream_group_lag",
            "Entries of the stream not yet delivered to the group (last scan)",
            ["stream", "group"],
            registry=r,
        )
        self.reclaim_delay = Histogram(
            "rig_reclaim_delay_seconds",
            "How long a moved entry had sat idle when it moved",
            ["stream", "group", "reason"],
            buckets=WORK_BUCKETS,
            registry=r,
        )

    def _audit_families(self, r: CollectorRegistry) -> None:
        """The last finished audit's verdict (rig-conductor audit records it in PostgreSQL)."""
        self.audit_lost = Gauge(
            "rig_audit_lost_entries",
            "Entries the last audit found lost (dispatched, never done, no longer pending)",
            registry=r,
        )
        self.audit_duplicates = Gauge(
            "rig_audit_duplicate_issues",
            "Issues the last audit found done twice",
            registry=r,
        )
        self.audit_finished = Gauge(
            "rig_audit_last_finished_timestamp_seconds",
            "When the last audit finished (0: no audit has finished yet)",
            registry=r,
        )

    def heartbeats_stored(self, agents: Sequence[str], *, at: float | None = None) -> None:
        """One committed batch of heartbeats, by agent id (one per heartbeat)."""
        self.heartbeats.inc(len(agents))
        now = time.time() if at is None else at
        for agent in set(agents):
            self.heartbeat_age.labels(agent).set(0)
            self.agent_up.labels(agent).set(1)
            self._heard[agent] = now

    def registry_read(self, agents: Set[str], *, at: float | None = None) -> set[str]:
        """A scan read the registry and found `agents` in it. The agents the previous reading
        had and this one lacks were forgotten: their series go now; returns them."""
        now = time.time() if at is None else at
        for agent in agents:
            self._heard[agent] = now
        gone = self._registry - agents
        self._registry = set(agents)
        self._drop(gone)
        return gone

    def forget_silent(self, *, before: float, keep: Set[str], now: float | None = None) -> set[str]:
        """Remove every series naming an agent this replica has not heard of since `before`
        (epoch seconds), except the agents in `keep`; returns the agents forgotten.

        For every replica, leading or not: each exports the series of the heartbeats it took
        in and of the reclaims it counted, and the registry forgets agents whatever replica
        heard them. An agent named by a series but never heard of here starts its clock `now`.
        """
        now = time.time() if now is None else now
        for agent in self._agent_label_sets():
            self._heard.setdefault(agent, now)
        gone = {a for a, at in self._heard.items() if at < before and a not in keep}
        self._drop(gone)
        return gone

    def _drop(self, agents: Set[str]) -> None:
        if not agents:
            return
        label_sets = self._agent_label_sets()
        for agent in agents:
            self._heard.pop(agent, None)
            for family, labels in label_sets.get(agent, ()):
                # A label set naming two forgotten agents is met twice.
                with contextlib.suppress(KeyError):
                    family.remove(*labels)
                if isinstance(family, Gauge):
                    self._label_sets.get(family, set()).discard(labels)

    def _agent_label_sets(self) -> dict[str, list[tuple[Counter | Gauge, tuple[str, ...]]]]:
        """Every label set of the families labelled by agent, by the agents it names."""
        found: dict[str, list[tuple[Counter | Gauge, tuple[str, ...]]]] = {}
        for family, names, agent_labels in self._by_agent:
            for metric in family.collect():
                for sample in metric.samples:
                    if sample.name.endswith("_created"):
                        continue
                    labels = tuple(sample.labels[n] for n in names)
                    for label in agent_labels:
                        agent = sample.labels[label]
                        if agent != UNKNOWN_AGENT:
                            found.setdefault(agent, []).append((family, labels))
        return found

    def replace(self, gauge: Gauge, values: Mapping[tuple[str, ...], float]) -> None:
        """Set `gauge` to exactly `values`: label sets absent from them are removed."""
        previous = self._label_sets.get(gauge, set())
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        for labels in previous - values.keys():
            gauge.remove(*labels)
        self._label_sets[gauge] = set(values)
