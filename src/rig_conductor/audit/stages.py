"""What the audit's stages hand each other: the events `job` loaded, the findings `summary`
writes, and the milliseconds each stage took. Shared by job.py and summary.py so that neither
imports the other; holds no rule and does no I/O of its own."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from rig_conductor.audit.sources import EventBounds


def ms_since(started: float) -> int:
    """Milliseconds since `started`, a `time.perf_counter()` reading."""
    return round((time.perf_counter() - started) * 1000)


@dataclass
class Loaded:
    """The window's events, read once, with what the read found."""

    events: DataFrame
    # The agents' liveness intervals in the window (small: one row per unbroken stretch).
    intervals: DataFrame
    bounds: EventBounds
    rows: int
    partitions: int
    cached: list[DataFrame] = field(default_factory=list)
    staged: Path | None = None

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)


@dataclass
class Findings:
    """The reconciled frames, each read back from the Parquet it was written to."""

    status: DataFrame
    lost: DataFrame
    duplicates: DataFrame
    overlaps: DataFrame
    reclaims: DataFrame
    latency: DataFrame
    histogram: DataFrame
    availability: DataFrame
    down_periods: DataFrame
    dead_letter_rate: DataFrame
    dead_letters: DataFrame
    pending_over_time: DataFrame
    sightings: DataFrame
    reports: DataFrame

    def tables(self) -> dict[str, DataFrame]:
        """The Parquet tables written under the output directory, by name."""
        return {
            "entries": self.status,
            "lost": self.lost,
            "duplicates": self.duplicates,
            "overlapping_attempts": self.overlaps,
            "reclaims": self.reclaims,
            "reclaim_latency_histogram": self.histogram,
            "availability": self.availability,
            "agent_down_periods": self.down_periods,
            "dead_letter_rate": self.dead_letter_rate,
            "dead_letters": self.dead_letters,
            "pending_over_time": self.pending_over_time,
            "detector_sightings": self.sightings,
        }
