"""POST /api/events: heartbeats, dispatches and work reports, one event per request."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import Body, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rig_conductor import roles
from rig_conductor.adapters.postgres import intake, work
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime
from rig_conductor.domain import (
    AgentId,
    AssignmentState,
    ConsumerName,
    EntryId,
    EventKind,
    GroupName,
    StagedOutput,
    StreamKey,
)
from rig_conductor.operations import agent_dead_letter, dispatch, reports, work_metrics

logger = logging.getLogger(__name__)
# Every heartbeat gets the same answer: encoded once.
_ACCEPTED = json.dumps(schemas.Accepted().model_dump(by_alias=True)).encode()

RESPONSES: dict[int | str, dict[str, Any]] = {
    **schemas.ERRORS,
    200: {
        "model": schemas.DispatchResult,
        "description": "ISSUE_ASSIGNED repeated: the original entry",
    },
    201: {
        "model": schemas.DispatchResult | schemas.DeadLetterResult,
        "description": "ISSUE_ASSIGNED appended to the stream, or DEAD_LETTER done",
    },
    202: {
        "model": schemas.Accepted | schemas.WorkResult,
        "description": "HEARTBEAT stored, or a work report recorded",
    },
    403: {"description": "a bound credential speaking for another agent, or dispatching"},
    409: {
        "model": schemas.Fenced,
        "description": "the report's attempt is outdated (fenced off), or the report does not "
        "come from the entry's owner (refused: nothing recorded); a HEARTBEAT naming a consumer "
        "past RIG_MAX_CONSUMERS_PER_AGENT (refused: nothing registered)",
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
    if isinstance(event, schemas.HeartbeatEvent):
        return await heartbeat(event, caller, rt)
    if (refused := await _refused_speaker(event, caller, rt)) is not None:
        return refused
    if isinstance(event, schemas.IssueAssignedEvent):
        return await _dispatch(event, rt)
    if isinstance(event, schemas.DeadLetterEvent):
        return await _dead_letter(event, rt)
    return await _work(event, rt)


async def _refused_speaker(
    event: schemas.Event, caller: roles.Caller, rt: Runtime
) -> Response | None:
    """403 when a bound credential may not send `event` (contract: "Who may speak for whom")."""
    if caller.binding is None:
        return None
    if isinstance(event, schemas.IssueAssignedEvent):
        refused: str | None = "a credential bound to one agent may not dispatch"
    else:
        refused = await reports.refusal(
            rt.known_agents,
            caller.binding,
            agent_id=event.agent_id,
            consumer=event.consumer,
            work=not isinstance(event, schemas.HeartbeatEvent),
        )
    if refused is None:
        return None
    rt.refusal_log.log(
        logger, logging.WARNING, "Refused speaker", "Refused %s from %s: %s",
        event.type, caller.who, refused,
    )  # fmt: skip
    return JSONResponse({"detail": refused}, status_code=403)


async def heartbeat(event: schemas.HeartbeatEvent, caller: roles.Caller, rt: Runtime) -> Response:
    """A heartbeat, stored before the 202 is sent; from the route, or from the heartbeat's own
    lane (`api.heartbeat_lane`) that most heartbeats take."""
    if (refused := await _refused_speaker(event, caller, rt)) is not None:
        return refused
    agent = AgentId(event.agent_id)
    beat = intake.HeartbeatIn(
        agent,
        ConsumerName(event.consumer) if event.consumer else None,
        event.degraded,
        tuple(event.degraded_reasons),
    )
    consumer = beat.consumer
    if consumer is None or rt.consumers.known(agent, consumer):
        await rt.heartbeats.submit(beat)  # the hot path: no check, no query
    else:
        # A consumer new here: checked against RIG_MAX_CONSUMERS_PER_AGENT, and stored before
        # the next new consumer of the agent is checked.
        async with rt.consumers.admitting(agent):
            if (too_many := await rt.consumers.refusal(agent, consumer)) is not None:
                rt.refusal_log.log(
                    logger, logging.WARNING, "Consumer limit", "Refused HEARTBEAT from %s: %s",
                    caller.who, too_many,
                )  # fmt: skip
                return JSONResponse({"detail": too_many}, status_code=409)
            await rt.heartbeats.submit(beat)
    if consumer is not None:
        rt.consumers.heard(agent, consumer)
    rt.known_agents.heard(event.agent_id)  # stored: known to the speaking rule at once
    return Response(_ACCEPTED, status_code=202, media_type="application/json")


async def _dispatch(event: schemas.IssueAssignedEvent, rt: Runtime) -> JSONResponse:
    """The dispatch (`operations.dispatch`) as HTTP: 201 appended, 200 a repeat of a key, 503
    when fewer replicas than RIG_REDIS_WAIT_REPLICAS hold the entry."""
    issue = dispatch.Assignment(
        event.issue_id, event.agent_id, event.payload, event.idempotency_key
    )
    done = await dispatch.dispatch(rt, issue)
    if done.under_replicated:
        detail = (
            f"appended as {done.entry_id}, but only {done.acked} of {done.wanted} replicas hold "
            "it; a failover now could lose it. Retry with the same idempotency key."
        )
        return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})
    body = schemas.DispatchResult(stream=done.stream, entry_id=done.entry_id)
    return JSONResponse(body.model_dump(by_alias=True), status_code=201 if done.appended else 200)


async def _work(event: schemas.WorkEvent, rt: Runtime) -> JSONResponse:
    group = event.group
    if group is None:  # an agent of the previous release: its group is told from its work
        legacy = await reports.legacy_group(
            rt,
            kind=event.type,
            stream=event.stream,
            entry_id=event.entry_id,
            consumer=event.consumer,
            attempt=event.attempt,
        )
        rt.metrics.legacy_events.labels(event.type).inc()
        if legacy.problem is not None:
            return _unnamed_group(legacy.problem)
        if legacy.refusal is not None:
            outcome = work.WorkOutcome(False, 0, "not-held", legacy.refusal)
            return _refused(event, legacy.refusal, outcome, rt)
        group = legacy.group
    held = False
    if isinstance(event, schemas.WorkStartedEvent | schemas.WorkPublishedEvent):
        # One XPENDING on the group named, whatever the number of groups of the stream.
        not_held = (
            await reports.not_held(
                rt.redis,
                stream=event.stream,
                group=group,
                entry_id=event.entry_id,
                consumer=event.consumer,
            )
            if group is not None
            else f"consumer {event.consumer} does not hold entry {event.entry_id} in any group"
        )
        if not_held is not None and isinstance(event, schemas.WorkStartedEvent):
            outcome = work.WorkOutcome(False, 0, "not-held", not_held)
            return _refused(event, not_held, outcome, rt)
        # A publish comes from the accepted attempt's owner, or from whoever holds it now.
        held = not_held is None
    outcome = await work.record_work(
        rt.engine, tenant=rt.settings.tenant, report=_report(event, group=group, held=held)
    )
    if outcome.refusal is not None:
        return _refused(event, outcome.refusal, outcome, rt)
    await work_metrics.finished(
        rt,
        kind=event.type,
        stream=event.stream,
        group=group,
        entry_id=event.entry_id,
        attempt=outcome.attempt if event.type == EventKind.WORK_STARTED else event.attempt,
        error=event.error,
        accepted=outcome.accepted,
    )
    if not outcome.accepted and event.type != EventKind.WORK_FAILED:
        rt.refusal_log.log(
            logger,
            logging.WARNING,
            "Fenced",
            "Fenced %s of %s on %s from %s: attempt %s, current attempt %d (%s)",
            event.type,
            event.entry_id,
            event.stream,
            event.consumer or event.agent_id,
            event.attempt,
            outcome.attempt,
            outcome.state,
        )
        return _fenced(outcome)
    if event.type == EventKind.WORK_STARTED:
        return JSONResponse(
            schemas.WorkStarted(attempt=outcome.attempt).model_dump(by_alias=True), status_code=202
        )
    result = schemas.WorkResult(
        accepted=outcome.accepted, attempt=outcome.attempt, state=outcome.state
    )
    return JSONResponse(result.model_dump(by_alias=True), status_code=202)


async def _dead_letter(event: schemas.DeadLetterEvent, rt: Runtime) -> JSONResponse:
    """201 dead-lettered; 409 when the entry is done (with its outputs still to publish) or the
    asker may not have it dead-lettered (nothing written)."""
    request = agent_dead_letter.Request(
        AgentId(event.agent_id),
        ConsumerName(event.consumer),
        StreamKey(event.stream),
        GroupName(event.group),
        EntryId(event.entry_id),
        event.reason,
    )
    outcome = await agent_dead_letter.dead_letter(rt, request)
    if isinstance(outcome, agent_dead_letter.Refused):
        rt.refusal_log.log(
            logger,
            logging.WARNING,
            "Refused DEAD_LETTER",
            "Refused DEAD_LETTER of %s on %s from %s: %s",
            event.entry_id,
            event.stream,
            event.consumer,
            outcome.why,
        )
        body = schemas.Fenced(detail=f"refused: {outcome.why}", attempt=0, state="not-held")
        return JSONResponse(body.model_dump(by_alias=True, exclude_none=True), status_code=409)
    if isinstance(outcome, agent_dead_letter.Done):
        return _fenced(outcome.finished)
    result = schemas.DeadLetterResult(
        stream=event.stream,
        entry_id=outcome.entry_id,
        dlq_stream=redis_streams.dlq_key(StreamKey(event.stream), rt.redis),
        dlq_id=outcome.dlq_id,
        deliveries=outcome.deliveries,
    )
    return JSONResponse(result.model_dump(by_alias=True), status_code=201)


def _unnamed_group(problem: str) -> JSONResponse:
    """422 naming `group`: the event names none, and its group cannot be told."""
    errors = [{"field": "group", "message": problem, "type": "missing"}]
    return JSONResponse({"detail": f"group: {problem}", "errors": errors}, status_code=422)


def _report(event: schemas.WorkEvent, *, group: str | None, held: bool) -> work.WorkReport:
    outputs: tuple[StagedOutput, ...] = ()
    missing: tuple[str, ...] = ()
    if isinstance(event, schemas.WorkCompletedEvent):
        outputs = tuple(StagedOutput(item.staged, item.path) for item in event.outputs)
    elif isinstance(event, schemas.WorkPublishedEvent):
        missing = tuple(event.missing)
    return work.WorkReport(
        kind=event.type,
        agent_id=event.agent_id,
        stream=event.stream,
        entry_id=event.entry_id,
        consumer=event.consumer,
        issue_id=event.issue_id,
        attempt=event.attempt,
        error=event.error,
        outputs=outputs,
        missing=missing,
        held=held,
        group=group,
    )


def _fenced(outcome: work.WorkOutcome) -> JSONResponse:
    """409 for a report that lost to the entry's current attempt, or about an entry already
    done: its attempt and state, and a done entry's outputs still to publish."""
    fenced = schemas.Fenced(
        detail=_fenced_detail(outcome.state),
        attempt=outcome.attempt,
        state=outcome.state,
        outputs=_outputs(outcome.outputs),
    )
    return JSONResponse(fenced.model_dump(by_alias=True, exclude_none=True), status_code=409)


def _outputs(outputs: tuple[StagedOutput, ...]) -> list[schemas.StagedOutputModel] | None:
    if not outputs:
        return None
    return [schemas.StagedOutputModel(staged=item.staged, path=item.path) for item in outputs]


def _fenced_detail(state: str) -> str:
    if state == AssignmentState.SUPERSEDED:
        return (
            "fenced: Redis lost this entry and its dispatch was appended again as a new entry; "
            "that one counts"
        )
    if state in (AssignmentState.DONE, AssignmentState.DEAD):
        return f"fenced: the entry is already {state}"
    return "fenced: a newer attempt owns this entry"


def _refused(
    event: schemas.WorkEvent, why: str, outcome: work.WorkOutcome, rt: Runtime
) -> JSONResponse:
    """409 for a report that does not come from the entry's owner: nothing was recorded."""
    rt.refusal_log.log(
        logger,
        logging.WARNING,
        "Refused report",
        "Refused %s of %s on %s from %s: %s",
        event.type,
        event.entry_id,
        event.stream,
        event.consumer,
        why,
    )
    body = schemas.Fenced(detail=f"refused: {why}", attempt=outcome.attempt, state=outcome.state)
    return JSONResponse(body.model_dump(by_alias=True), status_code=409)
