"""The console's actions (POST): requeue and delete dead letters, move pending entries by hand,
preview and run a scan (signing in and out: `signin`). Each change needs the session's CSRF
token and a role that may change things, and leaves an audit line and an event-log row."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import Response

from rig_conductor.console import web
from rig_conductor.console.session import Session
from rig_conductor.domain import NotLeading
from rig_conductor.operations import deadletters, moves, scans

router = APIRouter(include_in_schema=False)

SessionDep = Annotated[Session, Depends(web.current)]
Csrf = Annotated[str | None, Form()]
Field = Annotated[str, Form(max_length=256)]


@router.post("/deadletters/{action}")
async def dead_letters(
    request: Request,
    you: SessionDep,
    action: deadletters.Action,
    stream: Field,
    csrf: Csrf = None,
    ids: Annotated[list[web.EntryIdText] | None, Form()] = None,
    one: Annotated[web.EntryIdText | None, Form()] = None,
    all_matching: Annotated[bool, Form()] = False,
    q: Field = "",
    reason: Field = "",
) -> Response:
    """`/deadletters/requeue` or `/deadletters/delete`: `one` (a row's own button) alone, else
    the selected `ids`, else all that match."""
    web.require_change(request, you, csrf)
    chosen = [one] if one else ids
    key = web.stream_key(request, stream)
    rt = web.runtime(request)
    if all_matching and not chosen:
        where = deadletters.Filter(text=q, reason=reason)
        count = await deadletters.apply_to_matching(rt, you.caller, action, stream=key, where=where)
    else:
        count = await deadletters.apply_to(rt, you.caller, action, stream=key, dlq_ids=chosen or [])
    done = deadletters.DONE[action]
    return web.redirect(
        request, "/deadletters", stream=stream, q=q, reason=reason, done=done, n=count
    )


@router.post("/move")
async def move(
    request: Request,
    you: SessionDep,
    stream: Field,
    group: Field,
    consumer: Field,
    target: Field,
    csrf: Csrf = None,
    entries: Annotated[list[web.EntryIdText] | None, Form()] = None,
) -> Response:
    """`entries` are the ids of the selected entries; what they are now (owner, idle time,
    deliveries) the move reads from Redis, not from the form."""
    web.require_change(request, you, csrf)
    key = web.stream_key(request, stream)
    try:
        done = await moves.move(
            web.runtime(request),
            you.caller,
            stream=key,
            group=group,
            owner=consumer,
            target=target,
            ids=entries or [],
        )
    except moves.MoveRefused as exc:
        return web.page(request, "error.html", you, status_code=409, message=str(exc))
    return web.redirect(
        request,
        "/pending",
        stream=stream,
        group=group,
        consumer=consumer,
        done="moved",
        n=len(done.moved),
        of=done.selected,
        to=target,
        dead=len(done.dead_lettered),
        gone=len(done.not_held),
        left=done.left,
    )


@router.post("/scan")
async def scan(
    request: Request,
    you: SessionDep,
    csrf: Csrf = None,
    apply: Annotated[bool, Form()] = False,
) -> Response:
    """A dry run (a preview: changes nothing, any role) or, with `apply`, a real scan."""
    if apply:
        web.require_change(request, you, csrf)
    elif not you.csrf_ok(csrf or request.headers.get("x-csrf-token")):
        raise web.Refused(403, "missing or invalid CSRF token; reload the page")
    rt = web.runtime(request)
    try:
        report = (await rt.scan(not apply)).model_dump(by_alias=True)
    except NotLeading as exc:
        return web.page(request, "error.html", you, status_code=409, message=str(exc))
    if apply:
        await scans.record_console_scan(rt, you.caller, report)
    return web.page(request, "scan.html", you, report=report, dry_run=not apply)
