"""Dead letters for operators: list a stream's DLQ, put one back on its stream, delete one."""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from pydantic import AfterValidator

from rig_conductor import domain, roles
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime, caller, runtime
from rig_conductor.domain import StreamKey
from rig_conductor.operations import deadletters, views

logger = logging.getLogger(__name__)
router = APIRouter(tags=["dead letters"], responses=schemas.ERRORS)


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
    responses={404: {"model": schemas.Problem, "description": "no such dead letter"}},
)
async def requeue(
    request: schemas.RequeueRequest,
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
) -> JSONResponse:
    """Append the dead letter's original fields to its stream as a new entry and delete it from
    the DLQ, atomically; recorded in the event log. An operator action."""
    stream = StreamKey(request.stream)
    entry_id = await deadletters.requeue(rt, who, stream=stream, dlq_id=request.dlq_id)
    if entry_id is None:
        raise HTTPException(404, detail=f"no dead letter {request.dlq_id} in {stream}:dlq")
    body = schemas.Requeued(stream=stream, entry_id=entry_id, dlq_id=request.dlq_id)
    return JSONResponse(body.model_dump(by_alias=True), status_code=201)


@router.delete(
    "/deadletters",
    status_code=204,
    responses={404: {"model": schemas.Problem, "description": "no such dead letter"}},
)
async def delete(
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
    stream: Annotated[schemas.NameParam, Query(max_length=domain.NAME_MAX_LENGTH)],
    dlq_id: Annotated[
        str,
        Query(
            alias="dlqId",
            pattern=schemas.ENTRY_ID_PATTERN,
            max_length=domain.ENTRY_ID_MAX_LENGTH,
        ),
        AfterValidator(domain.entry_id),
    ],
) -> Response:
    """Delete one dead letter for good; recorded in the event log. An operator action."""
    key = StreamKey(stream)
    if not await deadletters.delete(rt, who, stream=key, dlq_id=dlq_id):
        raise HTTPException(404, detail=f"no dead letter {dlq_id} in {key}:dlq")
    return Response(status_code=204)
