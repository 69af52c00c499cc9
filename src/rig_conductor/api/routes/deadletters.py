"""Dead letters for operators: list a stream's DLQ, put one back on its stream, delete one."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Body, Depends, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator

from rig_conductor import domain, roles
from rig_conductor.api import schemas, work_schemas
from rig_conductor.api.deps import Runtime, caller, runtime
from rig_conductor.domain import StreamKey
from rig_conductor.operations import deadletters, views

logger = logging.getLogger(__name__)
router = APIRouter(tags=["dead letters"], responses=schemas.ERRORS)


def _unprocessable(field: str, message: str) -> JSONResponse:
    problem = schemas.ValidationProblem(
        detail=f"{field}: {message}",
        errors=[schemas.FieldProblem(field=field, message=message, type="value_error")],
    )
    return JSONResponse(problem.model_dump(by_alias=True), status_code=422)


@router.get(
    "/deadletters", response_model=list[schemas.DeadLetterView], response_model_by_alias=True
)
async def list_dead_letters(
    rt: Annotated[Runtime, Depends(runtime)],
    stream: Annotated[schemas.NameParam | None, Query(max_length=domain.NAME_MAX_LENGTH)] = None,
    count: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[schemas.DeadLetterView] | JSONResponse:
    """The newest dead letters of `stream` (default: RIG_DISPATCH_STREAM), newest first. Only a
    stream the conductor watches (RIG_STREAMS, or the dispatch stream) has dead letters here:
    any other name is a 422, so the route cannot be used to read other keys' neighbours."""
    if stream is not None and not views.known_stream(rt.settings, stream):
        message = f"{stream!r} is not a watched stream (RIG_STREAMS or RIG_DISPATCH_STREAM)"
        problem = schemas.ValidationProblem(
            detail=f"stream: {message}",
            errors=[schemas.FieldProblem(field="stream", message=message, type="value_error")],
        )
        return JSONResponse(problem.model_dump(by_alias=True), status_code=422)
    key = StreamKey(stream or rt.settings.dispatch_stream)
    letters = await deadletters.newest(rt, stream=key, count=count)
    return [schemas.DeadLetterView(stream=key, **asdict(d)) for d in letters]


@router.post(
    "/deadletters/requeue",
    status_code=201,
    response_model=schemas.Requeued,
    response_model_by_alias=True,
    responses={
        200: {"model": work_schemas.DeadLettersDone, "description": "how many were requeued"},
        404: {"model": schemas.Problem, "description": "no such dead letter"},
    },
)
async def requeue(
    request: work_schemas.DeadLettersRequest,
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
) -> JSONResponse:
    """Append the dead letter's original fields to its stream as a new entry and delete it from
    the DLQ, atomically; recorded in the event log. An operator action. `dlqIds` (several) or
    `match` (every one that matches: `reason` exactly, `text` in any field) instead of `dlqId`
    answers 200 with how many were requeued."""
    stream = StreamKey(request.stream)
    if request.dlq_id is None:
        count = await _many(rt, who, "requeue", request)
        if isinstance(count, JSONResponse):
            return count
        body = work_schemas.DeadLettersDone(stream=stream, requeued=count)
        return JSONResponse(body.model_dump(by_alias=True, exclude_none=True))
    entry_id = await deadletters.requeue(rt, who, stream=stream, dlq_id=request.dlq_id)
    if entry_id is None:
        raise HTTPException(404, detail=f"no dead letter {request.dlq_id} in {stream}:dlq")
    done = schemas.Requeued(stream=stream, entry_id=entry_id, dlq_id=request.dlq_id)
    return JSONResponse(done.model_dump(by_alias=True), status_code=201)


async def _many(
    rt: Runtime,
    who: roles.Caller,
    action: deadletters.Action,
    request: work_schemas.DeadLettersRequest,
) -> int | JSONResponse:
    """Several dead letters (`dlqIds`) or all that match (`match`), in batches; how many (a
    422 answer when the request names no watched stream or nothing to act on)."""
    stream = StreamKey(request.stream)
    if not views.known_stream(rt.settings, stream):
        return _unprocessable("stream", f"{stream!r} is not a watched stream")
    if request.dlq_ids is not None:
        return await deadletters.apply_to(
            rt, who, action, stream=stream, dlq_ids=request.dlq_ids, console=False
        )
    if request.match is None:
        return _unprocessable("dlqId", "give dlqId, dlqIds or match")
    where = deadletters.Filter(text=request.match.text or "", reason=request.match.reason or "")
    return await deadletters.apply_to_matching(
        rt, who, action, stream=stream, where=where, console=False
    )


@router.delete(
    "/deadletters",
    status_code=204,
    responses={
        200: {"model": work_schemas.DeadLettersDone, "description": "how many were deleted"},
        404: {"model": schemas.Problem, "description": "no such dead letter"},
    },
)
async def delete(
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
    stream: Annotated[schemas.NameParam | None, Query(max_length=domain.NAME_MAX_LENGTH)] = None,
    dlq_id: Annotated[
        str | None,
        Query(
            alias="dlqId",
            pattern=schemas.ENTRY_ID_PATTERN,
            max_length=domain.ENTRY_ID_MAX_LENGTH,
        ),
        AfterValidator(work_schemas.optional_entry_id),
    ] = None,
    many: Annotated[work_schemas.DeadLettersRequest | None, Body()] = None,
) -> Response:
    """Delete one dead letter for good (`?stream=S&dlqId=ID`, 204); recorded in the event log.
    An operator action. A body `{"stream","dlqIds":[...]}` or `{"stream","match":{...}}`
    deletes several, and answers 200 with how many."""
    if many is not None:
        count = await _many(rt, who, "delete", many)
        if isinstance(count, JSONResponse):
            return count
        body = work_schemas.DeadLettersDone(stream=many.stream, deleted=count)
        return JSONResponse(body.model_dump(by_alias=True, exclude_none=True))
    if stream is None or dlq_id is None:
        return _unprocessable("dlqId", "give stream and dlqId, or a body")
    key = StreamKey(stream)
    if not await deadletters.delete(rt, who, stream=key, dlq_id=dlq_id):
        raise HTTPException(404, detail=f"no dead letter {dlq_id} in {key}:dlq")
    return Response(status_code=204)
