"""The audit's verdicts: written by `rig-conductor audit` when it finishes, read by the
conductor for its rig_audit_* gauges. Decides nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.engine import create_sync_engine
from rig_conductor.adapters.postgres.tables import audit_runs, events
from rig_conductor.domain import EventKind


@dataclass(frozen=True, slots=True)
class AuditVerdict:
    finished_at: datetime
    dispatched: int
    lost: int
    duplicates: int


def record_audit(
    url: str, *, tenant: str, dispatched: int, lost: int, duplicates: int, output: str
) -> None:
    """Store a finished audit's verdict (how many entries it found dispatched and lost, how many
    issues done twice), and an AUDIT_COMPLETED event, in one transaction. Blocking: the audit's
    driver calls it once, at the end."""
    verdict = {"dispatched": dispatched, "lost": lost, "duplicates": duplicates}
    engine = create_sync_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(audit_runs.insert().values(tenant=tenant, output=output, **verdict))
            conn.execute(
                events.insert().values(
                    tenant=tenant,
                    kind=EventKind.AUDIT_COMPLETED,
                    detail={**verdict, "output": output},
                )
            )
    finally:
        engine.dispose()


async def last_audit(engine: AsyncEngine, *, tenant: str) -> AuditVerdict | None:
    """The tenant's most recent audit verdict, if any audit has finished."""
    query = (
        select(
            audit_runs.c.finished_at,
            audit_runs.c.dispatched,
            audit_runs.c.lost,
            audit_runs.c.duplicates,
        )
        .where(audit_runs.c.tenant == tenant)
        .order_by(audit_runs.c.id.desc())
        .limit(1)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    return AuditVerdict(row.finished_at, row.dispatched, row.lost, row.duplicates)
