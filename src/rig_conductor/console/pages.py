"""The console's views (GET): overview, group, a consumer's pending entries, agents, dead
letters, reclaim history and the scan page. Each reads through `operations`; none changes
anything."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse

from rig_conductor.console import web
from rig_conductor.console.session import Session
from rig_conductor.operations import deadletters, measured, views

router = APIRouter(include_in_schema=False)
PEL_PAGE = 100
STREAMS_PAGE = 20  # streams per page of the console's streams page
CONSUMERS_PAGE = 100  # consumers per page of a group's page
DLQ_PAGE = 50
HISTORY_ROWS = 200
REASONS = ("pod-gone", "down", "degraded", "stalled", "manual")

SessionDep = Annotated[Session, Depends(web.current)]
Text = Annotated[str, Query(max_length=256)]


@router.get("")
@router.get("/")
async def overview(request: Request, you: SessionDep) -> HTMLResponse:
    rt = web.runtime(request)
    seen = await measured.overview(rt)
    real = [s for s in reversed(seen.scans) if not s.dry_run]
    series = {
        "t": [int(s.finished_at.timestamp()) for s in real],
        "pending": [s.pending for s in real],
        "reclaimed": [s.reclaimed for s in real],
        "deadLettered": [s.dead_lettered for s in real],
    }
    work = {"t": seen.work.t, "finished": seen.work.finished, "lag": seen.work.lag}
    return web.page(
        request,
        "overview.html",
        you,
        seen=seen,
        scans=seen.scans[:10],
        series=json.dumps(series),
        work_series=json.dumps(work),
        work_finished=sum(seen.work.finished),
    )


@router.get("/streams")
async def streams(
    request: Request,
    you: SessionDep,
    after: Text | None = None,
    limit: Annotated[int, Query(ge=1, le=views.MAX_PAGE)] = STREAMS_PAGE,
) -> HTMLResponse:
    """Every group, a page of streams at a time, as the last scan measured them."""
    rows = await measured.streams(web.runtime(request), after=after, limit=limit)
    shown = list(dict.fromkeys(m.group.stream for m in rows))
    return web.page(
        request,
        "streams.html",
        you,
        rows=rows,
        after=after,
        limit=limit if limit != STREAMS_PAGE else None,
        next_after=shown[-1] if len(shown) == limit else None,
    )


@router.get("/group")
async def group(
    request: Request,
    you: SessionDep,
    stream: Text,
    name: Text,
    after: Text | None = None,
    limit: Annotated[int, Query(ge=1, le=views.MAX_PAGE)] = CONSUMERS_PAGE,
) -> HTMLResponse:
    """One group, read live, and a page of its consumers by name."""
    rt = web.runtime(request)
    stream = web.stream_key(request, stream)
    try:
        info, consumers = await views.group_consumers(
            rt, stream=stream, name=name, after=after, limit=limit
        )
    except LookupError as exc:
        return web.page(request, "error.html", you, status_code=404, message=str(exc))
    return web.page(
        request,
        "group.html",
        you,
        group=info,
        consumers=consumers,
        after=after,
        limit=limit if limit != CONSUMERS_PAGE else None,
        next_after=consumers[-1].name if len(consumers) == limit else None,
    )


@router.get("/pending")
async def pending(
    request: Request,
    you: SessionDep,
    stream: Text,
    group: Text,
    consumer: Text,
    after: Annotated[web.EntryIdText | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    rt = web.runtime(request)
    stream = web.stream_key(request, stream)
    try:
        info, owner, targets = await views.move_choices(
            rt, stream=stream, name=group, consumer=consumer
        )
    except LookupError as exc:
        return web.page(request, "error.html", you, status_code=404, message=str(exc))
    rows = await views.pending(
        rt, stream=stream, group=group, consumer=consumer, after=after, count=PEL_PAGE
    )
    return web.page(
        request,
        "pending.html",
        you,
        group=info,
        consumer=consumer,
        owner=owner,
        rows=rows,
        after=after,
        next_after=rows[-1].id if len(rows) == PEL_PAGE else None,
        targets=targets,
        flash_targets={c.name for c in info.consumers},
        max_deliveries=rt.settings.max_deliveries,
    )


@router.get("/agents")
async def agents(
    request: Request,
    you: SessionDep,
    after: Text | None = None,
    limit: Annotated[int, Query(ge=1, le=views.MAX_PAGE)] = views.AGENTS_PAGE,
) -> HTMLResponse:
    """A page of agents by id (keyset: `after` the last id shown), next-only like the
    pending entries: no page reads the whole registry."""
    rows = await views.agents(web.runtime(request), after=after, limit=limit)
    return web.page(
        request,
        "agents.html",
        you,
        agents=rows,
        after=after,
        limit=limit if limit != views.AGENTS_PAGE else None,
        next_after=rows[-1].agent_id if len(rows) == limit else None,
    )


@router.get("/deadletters")
async def dead_letters(
    request: Request,
    you: SessionDep,
    stream: Text = "",
    q: Text = "",
    reason: Text = "",
    before: Annotated[web.EntryIdText | None, Query(max_length=64)] = None,
) -> HTMLResponse:
    rt = web.runtime(request)
    key = web.stream_key(request, stream or rt.settings.dispatch_stream)
    where = deadletters.Filter(text=q, reason=reason)
    letters, next_before = await deadletters.find(
        rt, stream=key, where=where, before=before, count=DLQ_PAGE
    )
    return web.page(
        request,
        "deadletters.html",
        you,
        stream=key,
        q=q,
        reason=reason,
        letters=letters,
        before=before,
        next_before=next_before,
        streams=_stream_names(rt.settings.streams, rt.settings.dispatch_stream),
    )


@router.get("/reclaims")
async def reclaims(
    request: Request,
    you: SessionDep,
    stream: Text = "",
    agent: Text = "",
    reason: Text = "",
    hours: Annotated[float | None, Query(gt=0, le=24 * 365)] = None,
) -> HTMLResponse:
    rt = web.runtime(request)
    since = datetime.now(UTC) - timedelta(hours=hours) if hours else None
    rows = await views.reclaims(
        rt,
        stream=stream or None,
        agent=agent or None,
        reason=reason or None,
        since=since,
        limit=HISTORY_ROWS,
    )
    return web.page(
        request,
        "reclaims.html",
        you,
        rows=rows,
        stream=stream,
        agent=agent,
        reason=reason,
        hours=hours or "",
        reasons=REASONS,
    )


@router.get("/scan")
async def scan(request: Request, you: SessionDep) -> HTMLResponse:
    return web.page(request, "scan.html", you, report=None, dry_run=None)


def _stream_names(configured: tuple[str, ...], dispatch: str) -> list[str]:
    """The literal stream names the settings name (patterns cannot be listed without a scan)."""
    names = [dispatch, *(s for s in configured if not any(c in s for c in "*?["))]
    return list(dict.fromkeys(names))
