"""Dead letters for operators: list a stream's DLQ, put one entry back on its stream."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query
from fastapi.responses import JSONResponse

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import queries
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime, runtime
from rig_conductor.domain import StreamKey

logger = logging.getLogger(__name__)
router = APIRouter(tags=["dead letters"], responses=schemas.ERRORS)


@router.get(
    "/deadletters", response_model=list[schemas.DeadLetterView], response_model_by_alias=True
)
async def list_dead_letters(
    rt: Annotated[Runtime, Depends(runtime)],
    stream: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
    count: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[schemas.DeadLetterView]:
    """The newest dead letters of `stream` (default: RIG_DISPATCH_STREAM), newest first."""
    key = StreamKey(stream or rt.settings.dispatch_stream)
    letters = await redis_streams.list_dead_letters(rt.redis, stream=key, count=count)
    return [schemas.DeadLetterView(stream=key, **asdict(d)) for d in letters]


@router.post(
    "/deadletters/requeue",
    status_code=201,
    response_model=schemas.Requeued,
    response_model_by_alias=True,
    responses={404: {"model": schemas.Problem, "description": "no such dead letter"}},
)
async def requeue(
    request: schemas.RequeueRequest, rt: Annotated[Runtime, Depends(runtime)]
) -> JSONResponse:
    """Append the dead letter's original fields to its stream as a new entry and delete it from
    the DLQ, atomically; recorded in the event log."""
    stream = StreamKey(request.stream)
    done = await redis_streams.requeue(rt.redis, stream=stream, dlq_id=request.dlq_id)
    if done is None:
        raise HTTPException(404, detail=f"no dead letter {request.dlq_id} in {stream}:dlq")
    entry_id, issue_id = done
    await queries.append_events(
        rt.engine,
        tenant=rt.settings.tenant,
        rows=[
            queries.EventRow(
                "DEAD_LETTER_REQUEUED",
                stream=stream,
                entry_id=entry_id,
                issue_id=issue_id,
                detail=json.dumps({"dlqId": request.dlq_id}),
            )
        ],
    )
    logger.info("Requeued dead letter %s of %s as %s", request.dlq_id, stream, entry_id)
    body = schemas.Requeued(stream=stream, entry_id=entry_id, dlq_id=request.dlq_id)
    return JSONResponse(body.model_dump(by_alias=True), status_code=201)
