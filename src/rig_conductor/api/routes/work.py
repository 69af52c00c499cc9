"""Finding the work: the story of one issue, or of one stream entry (viewer role and up)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from rig_conductor import domain
from rig_conductor.api import schemas, work_schemas
from rig_conductor.api.deps import Runtime, runtime
from rig_conductor.api.paging import link_next
from rig_conductor.domain import EntryId, StreamKey
from rig_conductor.operations import views, work_story

router = APIRouter(tags=["finding the work"], responses=schemas.ERRORS)

Limit = Annotated[
    int,
    Query(ge=1, le=work_story.MAX_PAGE, description="timeline items per page (at most 1,000)"),
]
After = Annotated[
    int,
    Query(ge=0, le=2**63 - 1, description="the `next` of the previous page"),
]
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": schemas.Problem, "description": "no such work"}
}


@router.get(
    "/work/{issueId}",
    response_model=work_schemas.WorkStory,
    response_model_by_alias=True,
    responses=NOT_FOUND,
)
async def work_of_issue(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    issue_id: Annotated[str, Path(alias="issueId", min_length=1, max_length=256)],
    limit: Limit = work_story.TIMELINE_PAGE,
    after: After = 0,
) -> Response:
    """The issue's whole story: where its current entry stands in each group, and its
    timeline, a page at a time, across every entry it became (dispatched again after Redis
    lost its data, requeued from a dead letter). 404 for an issue never dispatched."""
    told = await work_story.of_issue(rt, issue_id, after=after, limit=limit)
    if told is None:
        raise HTTPException(404, detail=f"issue {issue_id!r} was never dispatched")
    return _document(told, request)


@router.get(
    "/streams/{stream:path}/entries/{entryId}",
    response_model=work_schemas.WorkStory,
    response_model_by_alias=True,
    responses=NOT_FOUND,
)
async def work_of_entry(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    stream: Annotated[schemas.NameParam, Path(max_length=domain.NAME_MAX_LENGTH)],
    entry_id: Annotated[
        str,
        Path(
            alias="entryId",
            pattern=schemas.ENTRY_ID_PATTERN,
            max_length=domain.ENTRY_ID_MAX_LENGTH,
        ),
        AfterValidator(domain.entry_id),
    ],
    limit: Limit = work_story.TIMELINE_PAGE,
    after: After = 0,
) -> Response:
    """The same document for one entry of a watched stream, dispatched through the API or
    appended by anyone else (then with what Redis and the event log know)."""
    if not views.known_stream(rt.settings, stream):
        raise HTTPException(404, detail=f"{stream!r} is not one of the configured streams")
    told = await work_story.of_entry(
        rt, StreamKey(stream), EntryId(entry_id), after=after, limit=limit
    )
    if told is None:
        raise HTTPException(404, detail=f"no entry {entry_id} in {stream}")
    return _document(told, request)


def _document(told: work_story.Story, request: Request) -> Response:
    """The document as JSON: the timeline's items carry only the fields that apply; the
    groups' `holder` and `attempt` are there, null when nobody holds the entry."""
    document = _story(told)
    body = document.model_dump(mode="json", by_alias=True)
    body["timeline"] = [
        item.model_dump(mode="json", by_alias=True, exclude_none=True) for item in document.timeline
    ]
    answer = JSONResponse(body)
    if told.next_after is not None:
        link_next(request, answer, told.next_after)
    return answer


def _story(told: work_story.Story) -> work_schemas.WorkStory:
    return work_schemas.WorkStory(
        issue_id=told.issue_id,
        stream=told.stream,
        entry_id=told.entry_id,
        state=told.state.value,
        groups=[
            work_schemas.GroupWork(
                group=g.group, state=g.state.value, holder=g.holder, attempt=g.attempt
            )
            for g in told.groups
        ],
        timeline=[
            work_schemas.TimelineItem.model_validate({**item, "kind": str(item["kind"])})
            for item in told.timeline
        ],
        entries=[e.entry_id for e in told.entries],
        next=None if told.next_after is None else str(told.next_after),
    )
