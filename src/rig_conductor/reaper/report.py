"""The scan report: what one scan saw and did, as `reap --once` and the scan endpoint show it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GroupOutcome:
    """What a scan did (or, in a dry run, would do) in one group where it acted."""

    stream: str
    group: str
    # Entries each target received.
    targets: dict[str, int] = field(default_factory=dict)
    by_reason: Counter[str] = field(default_factory=Counter)
    reclaimed: int = 0
    dead_lettered: int = 0
    no_target: int = 0
    degraded_held: int = 0
    skipped: int = 0
    # How many pending entries each consumer gained (or lost, negative): not in the JSON.
    changes: Counter[str] = field(default_factory=Counter, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "group": self.group,
            "targets": self.targets,
            "reclaimed": self.reclaimed,
            "reclaimedByReason": dict(self.by_reason),
            "deadLettered": self.dead_lettered,
            "noTarget": self.no_target,
            "degradedHeld": self.degraded_held,
            "skipped": self.skipped,
        }


@dataclass
class ScanReport:
    """What one scan saw and did. In a dry run the counts are what it would have done."""

    dry_run: bool
    streams: int = 0
    groups: int = 0
    pending: int = 0
    consumers_down: int = 0
    consumers_degraded: int = 0
    reclaimed: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    dead_lettered: int = 0
    no_target: int = 0
    # Entries of degraded-stale owners left in place: no non-degraded target (rule 3b).
    degraded_held: int = 0
    # Chosen, but acked, re-read, trimmed or claimed elsewhere before the move: left alone.
    skipped: int = 0
    # The detector's count: consumers holding entries with no fresh heartbeat behind them.
    without_heartbeat: int = 0
    # Cluster nodes this scan could not read or act on (left for the next scan).
    nodes_failed: list[str] = field(default_factory=list)
    # Dispatches Redis had lost (a failover, a restart), appended again (`reaper.redispatch`).
    redispatched: int = 0
    duration_ms: int = 0
    per_group: list[GroupOutcome] = field(default_factory=list)

    def add(self, outcome: GroupOutcome) -> None:
        self.per_group.append(outcome)
        self.reclaimed += outcome.reclaimed
        self.by_reason.update(outcome.by_reason)
        self.dead_lettered += outcome.dead_lettered
        self.no_target += outcome.no_target
        self.degraded_held += outcome.degraded_held
        self.skipped += outcome.skipped

    def to_json(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "groups": self.groups,
            "pending": self.pending,
            "consumersDown": self.consumers_down,
            "consumersDegraded": self.consumers_degraded,
            "reclaimed": self.reclaimed,
            "reclaimedByReason": dict(self.by_reason),
            "deadLettered": self.dead_lettered,
            "noTarget": self.no_target,
            "degradedHeld": self.degraded_held,
            "skipped": self.skipped,
            "consumersWithoutHeartbeat": self.without_heartbeat,
            "nodesFailed": self.nodes_failed,
            "redispatched": self.redispatched,
            "dryRun": self.dry_run,
            "durationMs": self.duration_ms,
            "groupsDetail": [outcome.to_json() for outcome in self.per_group],
        }
