"""The console's work page: find one piece of work by issue id (or entry id) and read its whole
story, as `GET /api/work/{issueId}` tells it. Reads only."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from rig_conductor import domain
from rig_conductor.console import web
from rig_conductor.console.session import Session
from rig_conductor.domain import EntryId
from rig_conductor.operations import views, work_story

router = APIRouter(include_in_schema=False)
SessionDep = Annotated[Session, Depends(web.current)]
Text = Annotated[str, Query(max_length=256)]
TIMELINE_PAGE = 200


@router.get("/work")
async def work(
    request: Request,
    you: SessionDep,
    q: Text = "",
    stream: Text = "",
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
) -> HTMLResponse:
    """`q` an issue id; or an entry id, of `stream` (default: the dispatch stream) when no
    issue has that id."""
    rt = web.runtime(request)
    q = q.strip()
    streams = [rt.settings.dispatch_stream, *rt.settings.streams]
    context: dict[str, Any] = {
        "q": q,
        "stream": stream,
        "streams": list(dict.fromkeys(streams)),
        "story": None,
    }
    if not q:
        return web.page(request, "work.html", you, **context)
    told = None
    if not stream:
        told = await work_story.of_issue(rt, q, after=after, limit=TIMELINE_PAGE)
    if told is None and _entry_id(q):
        key = web.stream_key(request, stream or rt.settings.dispatch_stream)
        if views.known_stream(rt.settings, key):
            told = await work_story.of_entry(rt, key, EntryId(q), after=after, limit=TIMELINE_PAGE)
    if told is None:
        return web.page(request, "work.html", you, status_code=404, **context)
    return web.page(request, "work.html", you, **{**context, "story": told, "after": after})


def _entry_id(text: str) -> bool:
    try:
        domain.entry_id(text)
    except ValueError:
        return False
    return True
