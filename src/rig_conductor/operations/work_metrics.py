"""The work metrics of a WORK_COMPLETED or WORK_FAILED report: `rig_work_finished_total` by
outcome, and `rig_work_duration_seconds` of an accepted completion (from its attempt's
WORK_STARTED, on PostgreSQL's clock)."""

from __future__ import annotations

from rig_conductor.adapters import failures
from rig_conductor.adapters.postgres import story
from rig_conductor.domain import EventKind
from rig_conductor.runtime import Runtime

# What an agent's runtime says when it gives up on a hung handler (agent.handlers).
ABANDONED_PREFIX = "abandoned"


async def finished(
    rt: Runtime,
    *,
    kind: EventKind,
    stream: str,
    group: str | None,
    entry_id: str,
    attempt: int | None,
    error: str | None,
    accepted: bool,
) -> None:
    if kind not in (EventKind.WORK_COMPLETED, EventKind.WORK_FAILED):
        return
    labels = (stream, group or "unknown")
    if not accepted:
        outcome = "fenced"
    elif kind == EventKind.WORK_COMPLETED:
        outcome = "completed"
    elif (error or "").startswith(ABANDONED_PREFIX):
        outcome = "abandoned"
    else:
        outcome = "failed"
    rt.metrics.work_finished.labels(*labels, outcome).inc()
    if outcome == "completed" and attempt is not None:
        try:
            took = await story.attempt_seconds(
                rt.engine,
                tenant=rt.settings.tenant,
                stream=stream,
                entry_id=entry_id,
                attempt=attempt,
                group=group,
            )
        except failures.UNAVAILABLE:  # the completion is recorded: its timing is not worth a 503
            return
        if took is not None:
            rt.metrics.work_duration.labels(*labels).observe(took)
