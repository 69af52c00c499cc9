"""The scan report: what one scan saw and did, as `reap --once`, the scan endpoint and the
console show it. One pydantic model, serialised once (camelCase on the wire).

The reaper fills it in as the scan goes; nothing here decides or does anything.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr
from pydantic.alias_generators import to_camel


class _Report(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class GroupOutcome(_Report):
    """What a scan did (or, in a dry run, would do) in one group where it acted."""

    stream: str
    group: str
    # Entries each target received.
    targets: dict[str, int] = Field(default_factory=dict)
    reclaimed: int = 0
    reclaimed_by_reason: dict[str, int] = Field(default_factory=dict)
    dead_lettered: int = 0
    no_target: int = 0
    degraded_held: int = 0
    skipped: int = 0
    # How many pending entries each consumer gained (or lost, negative): not on the wire.
    changes: Counter[str] = Field(default_factory=Counter, exclude=True, repr=False)


class ScanReport(_Report):
    """What one scan saw and did. In a dry run the counts are what it would have done."""

    streams: int = 0
    groups: int = 0
    pending: int = 0
    consumers_down: int = 0
    consumers_degraded: int = 0
    reclaimed: int = 0
    reclaimed_by_reason: dict[str, int] = Field(default_factory=dict)
    dead_lettered: int = 0
    no_target: int = 0
    # Entries of degraded-stale owners left in place: no non-degraded target (rule 3b).
    degraded_held: int = 0
    # Chosen, but acked, re-read, trimmed or claimed elsewhere before the move: left alone.
    skipped: int = 0
    # The detector's count: consumers holding entries with no fresh heartbeat behind them.
    consumers_without_heartbeat: int = 0
    # Cluster nodes this scan could not read or act on (left for the next scan).
    nodes_failed: list[str] = Field(default_factory=list)
    # The groups' lag summed: entries no consumer of their group has read yet (Redis 7's `lag`,
    # computed on 6.2); None when no group's lag could be told.
    lag: int | None = None
    # Dispatches Redis had lost (a failover, a restart), appended again (`reaper.redispatch`).
    redispatched: int = 0
    # Blind time inside the window that decided who is down (rule 3, docs/rules.md): silent agents
    # count as down this much later than RIG_AGENT_DOWN_MS.
    blind_ms: int = 0
    # Dispatch streams whose Redis this scan found had lost its data (`reaper.redis_loss`).
    redis_data_lost: list[str] = Field(default_factory=list)
    dry_run: bool
    duration_ms: int = 0
    # Where the scan's time went, in milliseconds per phase (summed over a cluster's nodes).
    phases_ms: dict[str, int] = Field(default_factory=dict)
    groups_detail: list[GroupOutcome] = Field(default_factory=list)
    _phase_s: dict[str, float] = PrivateAttr(default_factory=dict)

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Count the time spent inside the block towards `phase` in `phases_ms`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            spent = self._phase_s.get(phase, 0.0) + time.perf_counter() - started
            self._phase_s[phase] = spent
            self.phases_ms[phase] = round(spent * 1000)

    def add(self, outcome: GroupOutcome) -> None:
        self.groups_detail.append(outcome)
        self.reclaimed += outcome.reclaimed
        for reason, count in outcome.reclaimed_by_reason.items():
            self.reclaimed_by_reason[reason] = self.reclaimed_by_reason.get(reason, 0) + count
        self.dead_lettered += outcome.dead_lettered
        self.no_target += outcome.no_target
        self.degraded_held += outcome.degraded_held
        self.skipped += outcome.skipped
