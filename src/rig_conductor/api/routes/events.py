"""POST /api/events: heartbeats, dispatches and work reports, one event per request."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rig_conductor import roles
from rig_conductor.adapters import redis_client, redis_streams
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime
from rig_conductor.domain import AgentId, ConsumerName, EntryId, StreamKey
from rig_conductor.operations import reports

logger = logging.getLogger(__name__)
# How long a dispatch waits for RIG_REDIS_WAIT_REPLICAS replicas before answering 503.
WAIT_TIMEOUT_MS = 5_000
# Every heartbeat gets the same answer: encoded once.
_ACCEPTED = json.dumps(schemas.Accepted().model_dump(by_alias=True)).encode()

RESPONSES: dict[int | str, dict[str, Any]] = {
    **schemas.ERRORS,
    200: {
        "model": schemas.DispatchResult,
        "description": "ISSUE_ASSIGNED repeated: the original entry",
    },
    201: {"model": schemas.DispatchResult, "description": "ISSUE_ASSIGNED appended to the stream"},
    202: {
        "model": schemas.Accepted | schemas.WorkResult,
        "description": "HEARTBEAT stored, or a work report recorded",
    },
    403: {"description": "a bound credential speaking for another agent, or dispatching"},
    409: {
        "model": schemas.Fenced,
        "description": "the report's attempt is outdated (fenced off), or the report does not "
        "come from the entry's owner (refused: nothing recorded)",
    },
}


def install(app: FastAPI) -> None:
    """Adds `POST /api/events` to the app itself, not through an included router: FastAPI
    matches an included router's routes through a routing layer of the router's own, and this
    route takes every heartbeat."""
    app.add_api_route(
        "/api/events",
        post_event,
        methods=["POST"],
        responses=RESPONSES,
        status_code=202,
        response_model=None,
        tags=["events"],
    )


async def post_event(event: Annotated[schemas.Event, Body()], request: Request) -> Response:
    # The runtime straight from the app, not through Depends: this route takes every heartbeat.
    rt: Runtime = request.app.state.runtime
    caller: roles.Caller = getattr(request.state, "caller", roles.ANONYMOUS)
    if caller.binding is not None:
        refused = await _refusal(event, caller, rt)
        if refused is not None:
            logger.warning("Refused %s from %s: %s", event.type, caller.who, refused)
            return JSONResponse({"detail": refused}, status_code=403)
    if isinstance(event, schemas.HeartbeatEvent):
        return await _heartbeat(event, rt)
    if isinstance(event, schemas.IssueAssignedEvent):
        return await _dispatch(event, rt)
    return await _work(event, rt)


async def _refusal(event: schemas.Event, caller: roles.Caller, rt: Runtime) -> str | None:
    """Why a bound credential may not send `event` (contract: "Who may speak for whom")."""
    assert caller.binding is not None
    if isinstance(event, schemas.IssueAssignedEvent):
        return "a credential bound to one agent may not dispatch"
    return await reports.refusal(
        rt.known_agents,
        caller.binding,
        agent_id=event.agent_id,
        consumer=event.consumer,
        work=not isinstance(event, schemas.HeartbeatEvent),
    )


async def _heartbeat(event: schemas.HeartbeatEvent, rt: Runtime) -> Response:
    await rt.heartbeats.submit(
        queries.HeartbeatIn(
            AgentId(event.agent_id),
            ConsumerName(event.consumer) if event.consumer else None,
            event.degraded,
            tuple(event.degraded_reasons),
        )
    )
    rt.known_agents.heard(event.agent_id)  # stored: known to the speaking rule at once
    return Response(_ACCEPTED, status_code=202, media_type="application/json")


async def _dispatch(event: schemas.IssueAssignedEvent, rt: Runtime) -> JSONResponse:
    """Append first, atomically and at most once per key (in Redis, beside the stream); then
    record it in PostgreSQL, also at most once. A crash or an outage between the two leaves the
    record for the retry to complete, never a second entry. With RIG_REDIS_WAIT_REPLICAS, the
    answer waits until that many replicas hold the entry."""
    stream = StreamKey(rt.settings.dispatch_stream)
    key = event.idempotency_key or event.issue_id
    fields = {
        "type": "ISSUE_ASSIGNED",
        "issueId": event.issue_id,
        "agentId": event.agent_id,
        "payload": json.dumps(event.payload, separators=(",", ":")),
        "assignedAt": datetime.now(UTC).isoformat(),
    }
    remember_s = rt.settings.event_retention_days * 86_400
    wanted = rt.settings.redis_wait_replicas
    acked = wanted
    if wanted:
        entry_id, appended, acked = await _append_replicated(rt, stream, key, fields, remember_s)
    else:
        entry_id, appended = await redis_streams.append_once(
            rt.redis, stream=stream, key=key, fields=fields, remember_s=remember_s
        )
    await work.record_dispatch(
        rt.engine,
        tenant=rt.settings.tenant,
        key=key,
        issue_id=event.issue_id,
        agent_id=event.agent_id,
        stream=stream,
        entry_id=entry_id,
        fields=fields,
    )
    if appended:
        rt.metrics.dispatched.labels(stream).inc()
        logger.info("Dispatched %s to %s as %s", event.issue_id, stream, entry_id)
    if acked < wanted:
        logger.warning(
            "Dispatch %s appended as %s, but %d of %d replicas acknowledged it within %d ms",
            event.issue_id,
            entry_id,
            acked,
            wanted,
            WAIT_TIMEOUT_MS,
        )
        detail = (
            f"appended as {entry_id}, but only {acked} of {wanted} replicas hold it; a failover "
            "now could lose it. Retry with the same idempotency key."
        )
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})
    body = schemas.DispatchResult(stream=stream, entry_id=entry_id)
    return JSONResponse(body.model_dump(by_alias=True), status_code=201 if appended else 200)


async def _append_replicated(
    rt: Runtime, stream: StreamKey, key: str, fields: dict[str, str], remember_s: int
) -> tuple[EntryId, bool, int]:
    """The append and its WAIT on one connection to the stream's server. On a cluster whose
    slot map is stale, the append (idempotent) is tried again on the new owner, once."""
    return await redis_client.on_owner(
        rt.servers(),
        stream,
        lambda client: redis_streams.append_once_replicated(
            client,
            stream=stream,
            key=key,
            fields=fields,
            remember_s=remember_s,
            replicas=rt.settings.redis_wait_replicas,
            timeout_ms=WAIT_TIMEOUT_MS,
        ),
    )


async def _work(event: schemas.WorkEvent, rt: Runtime) -> JSONResponse:
    if isinstance(event, schemas.WorkStartedEvent):
        not_held = await reports.not_held(
            rt.redis, stream=event.stream, entry_id=event.entry_id, consumer=event.consumer
        )
        if not_held is not None:
            return _refused(event, not_held, work.WorkOutcome(False, 0, "not-held", not_held))
    outcome = await work.record_work(
        rt.engine,
        tenant=rt.settings.tenant,
        report=work.WorkReport(
            kind=event.type,
            agent_id=event.agent_id,
            stream=event.stream,
            entry_id=event.entry_id,
            consumer=event.consumer,
            issue_id=event.issue_id,
            attempt=event.attempt,
            error=event.error,
        ),
    )
    if outcome.refusal is not None:
        return _refused(event, outcome.refusal, outcome)
    if not outcome.accepted and event.type in ("WORK_STARTED", "WORK_PROGRESS", "WORK_COMPLETED"):
        logger.warning(
            "Fenced %s of %s on %s from %s: attempt %s, current attempt %d (%s)",
            event.type,
            event.entry_id,
            event.stream,
            event.consumer or event.agent_id,
            event.attempt,
            outcome.attempt,
            outcome.state,
        )
        fenced = schemas.Fenced(
            detail=_fenced_detail(outcome.state), attempt=outcome.attempt, state=outcome.state
        )
        return JSONResponse(fenced.model_dump(by_alias=True), status_code=409)
    if event.type == "WORK_STARTED":
        return JSONResponse(
            schemas.WorkStarted(attempt=outcome.attempt).model_dump(by_alias=True), status_code=202
        )
    result = schemas.WorkResult(
        accepted=outcome.accepted, attempt=outcome.attempt, state=outcome.state
    )
    return JSONResponse(result.model_dump(by_alias=True), status_code=202)


def _fenced_detail(state: str) -> str:
    if state == "superseded":
        return (
            "fenced: Redis lost this entry and its dispatch was appended again as a new entry; "
            "that one counts"
        )
    if state in ("done", "dead"):
        return f"fenced: the entry is already {state}"
    return "fenced: a newer attempt owns this entry"


def _refused(event: schemas.WorkEvent, why: str, outcome: work.WorkOutcome) -> JSONResponse:
    """409 for a report that does not come from the entry's owner: nothing was recorded."""
    logger.warning(
        "Refused %s of %s on %s from %s: %s",
        event.type,
        event.entry_id,
        event.stream,
        event.consumer,
        why,
    )
    body = schemas.Fenced(detail=f"refused: {why}", attempt=outcome.attempt, state=outcome.state)
    return JSONResponse(body.model_dump(by_alias=True), status_code=409)
