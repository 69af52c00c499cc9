"""What a scan saw, recorded: the detector's new sightings of consumers without heartbeat (a
`[StreamDetector]` line and a CONSUMER_WITHOUT_HEARTBEAT row each), the measurements the views
show, and its report. Not a change to the fleet, so a dry run records them too
(docs/operating.md). What counts as a sighting, and what the measurements are, is decided
before (`policy.detector`, `policy.measure`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.domain import EventKind, FleetMeasure, GroupMeasure
from rig_conductor.policy import detector

# The lines keep the logger they had when the reaper wrote them itself: operators filter on it.
logger = logging.getLogger(logs.OBSERVE_LOGGER)


async def sightings(new: Sequence[detector.Sighting], *, engine: AsyncEngine, tenant: str) -> None:
    """Announce the sightings the previous scan did not have, and record them."""
    for s in new:
        logger.warning(
            "[StreamDetector] Consumer %s holds %d pending entries on %s/%s with no fresh "
            "heartbeat (agent %s)",
            s.consumer,
            s.pending,
            s.stream,
            s.group,
            s.agent or "unknown",
            extra={
                "stream": s.stream,
                "group": s.group,
                "consumer": s.consumer,
                "agent": s.agent,
                "pending": s.pending,
            },
        )
    rows = [
        queries.EventRow(
            EventKind.CONSUMER_WITHOUT_HEARTBEAT,
            agent_id=s.agent,
            consumer=s.consumer,
            stream=s.stream,
            group_name=s.group,
            detail=json.dumps({"pending": s.pending}),
        )
        for s in new
    ]
    await pg_writes.append_events(engine, tenant=tenant, rows=rows)


async def measured(
    groups: Sequence[GroupMeasure],
    fleet: FleetMeasure,
    *,
    complete: bool,
    engine: AsyncEngine,
    tenant: str,
) -> None:
    """Store the scan's measurements (`complete`: it read every node)."""
    await pg_writes.store_measurements(
        engine, tenant=tenant, groups=groups, fleet=fleet, complete=complete
    )


async def reported(report: Mapping[str, Any], *, engine: AsyncEngine, tenant: str) -> None:
    """Keep the scan's report for the console's last scans and plots."""
    await pg_writes.record_scan(engine, tenant=tenant, report=report)
