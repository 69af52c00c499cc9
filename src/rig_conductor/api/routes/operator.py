"""Operator routes with the console's powers: a group's pending entries, moves by hand (the
console's guarded move, judged by rule 5 of docs/rules.md), and the reclaim history."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import AfterValidator

from rig_conductor import domain, roles
from rig_conductor.adapters import failures
from rig_conductor.api import schemas, work_schemas
from rig_conductor.api.deps import Runtime, caller, runtime
from rig_conductor.api.paging import link_next
from rig_conductor.domain import StreamKey
from rig_conductor.operations import moves, views

router = APIRouter(tags=["operator"], responses=schemas.ERRORS)

MAX_PAGE = 1_000
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="page size (at most 1,000)")]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": schemas.Problem, "description": "no such stream or group"}
}


@router.get(
    "/streams/{stream:path}/groups/{group}/pending",
    response_model=list[work_schemas.PendingView],
    response_model_by_alias=True,
    responses=NOT_FOUND,
)
async def group_pending(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    response: Response,
    stream: Annotated[schemas.NameParam, Path(max_length=domain.NAME_MAX_LENGTH)],
    group: Annotated[schemas.NameParam, Path(max_length=domain.NAME_MAX_LENGTH)],
    consumer: Annotated[schemas.NameParam | None, Query(max_length=domain.NAME_MAX_LENGTH)] = None,
    limit: Limit = 100,
    after: Annotated[
        str | None,
        Query(pattern=schemas.ENTRY_ID_PATTERN, max_length=domain.ENTRY_ID_MAX_LENGTH),
        AfterValidator(work_schemas.optional_entry_id),
    ] = None,
) -> list[work_schemas.PendingView]:
    """The group's pending entries (or one consumer's), oldest first, after entry `after`: a
    page of XPENDING, whatever the length of the list. A full page carries a `Link: rel="next"`."""
    if not views.known_stream(rt.settings, stream):
        raise HTTPException(404, detail=f"{stream!r} is not one of the configured streams")
    try:
        rows = await views.pending(
            rt, stream=stream, group=group, consumer=consumer, after=after, count=limit
        )
    except failures.RefusedRequest as exc:
        raise HTTPException(404, detail=f"no group {group!r} on stream {stream!r}") from exc
    if len(rows) == limit:
        link_next(request, response, rows[-1].id)
    return [
        work_schemas.PendingView(
            entry_id=row.id,
            consumer=row.consumer,
            idle_ms=row.idle_ms,
            deliveries=row.deliveries,
            issue_id=(row.fields or {}).get("issueId"),
        )
        for row in rows
    ]


@router.post(
    "/moves",
    response_model=work_schemas.MoveResult,
    response_model_by_alias=True,
    responses={
        403: {"model": schemas.Problem, "description": "a role that may not change things"},
        404: {"model": schemas.Problem, "description": "a stream that is not watched"},
        409: {"model": schemas.Problem, "description": "a target reaper rule 5 would not pick"},
    },
)
async def move_entries(
    request: work_schemas.MoveRequest,
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
) -> work_schemas.MoveResult:
    """Move pending entries of a group to a live consumer, as the console does: idle-guarded
    XCLAIM, a new attempt, the `[StreamReclaim] Reclaimed` line with reason `manual`. A target
    the reaper would not pick (rule 5, on the scan's evidence) is a 409 and nothing moves. An
    operator action."""
    if not views.known_stream(rt.settings, request.stream):
        raise HTTPException(404, detail=f"{request.stream!r} is not one of the configured streams")
    try:
        done = await moves.move_to(
            rt,
            who,
            stream=StreamKey(request.stream),
            group=request.group,
            target=request.to,
            ids=request.entry_ids,
        )
    except moves.MoveRefused as exc:
        raise HTTPException(409, detail=str(exc)) from None
    return work_schemas.MoveResult(
        moved=done.moved,
        skipped=[work_schemas.Skipped(entry_id=i, why=why) for i, why in done.skipped],
    )


@router.get(
    "/reclaims", response_model=list[work_schemas.ReclaimView], response_model_by_alias=True
)
async def reclaims(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    response: Response,
    stream: Annotated[schemas.NameParam | None, Query(max_length=domain.NAME_MAX_LENGTH)] = None,
    agent: Annotated[schemas.NameParam | None, Query(max_length=domain.NAME_MAX_LENGTH)] = None,
    reason: Annotated[schemas.NameParam | None, Query(max_length=64)] = None,
    since: datetime | None = None,
    limit: Limit = 100,
    after: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> list[work_schemas.ReclaimView]:
    """The moves (one item per batch moved together), newest first, from the event log;
    `after` is the previous page's last `id`. A full page carries a `Link: rel="next"`."""
    rows = await views.reclaims(
        rt,
        stream=stream,
        agent=agent,
        reason=reason,
        since=since,
        limit=limit,
        before_id=after,
    )
    if len(rows) == limit:
        link_next(request, response, rows[-1].id)
    return [
        work_schemas.ReclaimView(
            at=row.occurred_at,
            stream=row.stream,
            group=row.group,
            from_=row.from_consumer,
            from_agent=row.from_agent,
            to=row.to_consumer,
            to_agent=row.to_agent,
            reason=row.reason,
            by=row.by,
            entry_ids=list(row.entry_ids),
            id=str(row.id),
        )
        for row in rows
    ]
