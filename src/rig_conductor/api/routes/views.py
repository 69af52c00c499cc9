"""Operator views: agents, streams, and a scan on demand."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response

from rig_conductor import domain, roles
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime, caller, require, runtime
from rig_conductor.api.paging import link_next
from rig_conductor.operations import measured, views
from rig_conductor.scan_report import ScanReport

router = APIRouter(tags=["views"], responses=schemas.ERRORS)


Limit = Annotated[
    int,
    Query(ge=1, le=views.MAX_PAGE, description="page size (at most 1,000)"),
]
After = Annotated[
    schemas.NameParam | None,
    Query(max_length=domain.NAME_MAX_LENGTH, description="the last name of the previous page"),
]


@router.get("/agents", response_model=list[schemas.AgentView], response_model_by_alias=True)
async def list_agents(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    response: Response,
    limit: Limit = views.AGENTS_PAGE,
    after: After = None,
) -> list[schemas.AgentView]:
    """A page of the agents that heartbeated or are configured, by agent id after `after`,
    judged as the reaper judges them at the database's clock; each with its freshest 10
    consumers and `consumerCount`. A full page carries a `Link: rel="next"` header."""
    rows = await views.agents(rt, after=after, limit=limit)
    if len(rows) == limit:
        link_next(request, response, rows[-1].agent_id)
    return [_agent_view(agent) for agent in rows]


@router.get(
    "/agents/{agentId:path}",
    response_model=schemas.AgentView,
    response_model_by_alias=True,
    responses={404: {"model": schemas.Problem, "description": "no such agent"}},
)
async def one_agent(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    response: Response,
    agent_id: Annotated[
        schemas.NameParam, Path(alias="agentId", max_length=domain.NAME_MAX_LENGTH)
    ],
    limit: Limit = views.AGENTS_PAGE,
    after: After = None,
) -> schemas.AgentView:
    """One agent, configured or heard from, with a page of its consumers by name after
    `after`, and `consumerCount`, all of them. A full page carries a `Link: rel="next"`."""
    row = await views.agent(rt, agent_id, after=after, limit=limit)
    if row is None:
        raise HTTPException(404, detail=f"no agent {agent_id!r}")
    if len(row.consumers) == limit:
        link_next(request, response, row.consumers[-1])
    return _agent_view(row)


def _agent_view(agent: views.AgentRow) -> schemas.AgentView:
    return schemas.AgentView(
        agent_id=agent.agent_id,
        last_heartbeat_at=agent.last_heartbeat_at,
        heartbeat_age_ms=agent.heartbeat_age_ms,
        down=agent.down,
        degraded=agent.degraded,
        degraded_reasons=list(agent.degraded_reasons),
        consumers=list(agent.consumers),
        consumer_count=agent.consumer_count,
    )


@router.get("/streams", response_model=list[schemas.GroupView], response_model_by_alias=True)
async def list_streams(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    limit: Annotated[
        int, Query(ge=1, le=views.MAX_PAGE, description="streams per page (at most 1,000)")
    ] = measured.STREAMS_PAGE,
    after: After = None,
) -> Response:
    """The groups of a page of streams (by name after `after`), as the last scan measured them
    (`asOf`): pending, oldest pending idle, `consumerCount`, and at most 10 consumers, those
    holding the most first (`GET /api/streams/{stream}/groups/{group}/consumers` lists them
    all). A page that may not be the last carries a `Link: rel="next"` header."""
    # PostgreSQL builds the body in the `GroupView` shape (`measurements._STREAMS_PAGE_JSON`
    # says why); a Response returned as it is skips `response_model`, which only documents it.
    page = await measured.streams_json(rt, after=after, limit=limit)
    answer = Response(page.body, media_type="application/json")
    if page.streams == limit and page.last is not None:
        link_next(request, answer, page.last)
    return answer


@router.get(
    "/streams/{stream:path}/groups/{group}/consumers",
    response_model=list[schemas.GroupConsumerView],
    response_model_by_alias=True,
    responses={404: {"model": schemas.Problem, "description": "no such stream or group"}},
)
async def group_consumers(
    rt: Annotated[Runtime, Depends(runtime)],
    request: Request,
    response: Response,
    stream: Annotated[schemas.NameParam, Path(max_length=domain.NAME_MAX_LENGTH)],
    group: Annotated[schemas.NameParam, Path(max_length=domain.NAME_MAX_LENGTH)],
    limit: Limit = views.AGENTS_PAGE,
    after: After = None,
) -> list[schemas.GroupConsumerView]:
    """A page of the group's consumers by name after `after`, read live from Redis and judged
    by the reaper's rules. A full page carries a `Link: rel="next"` header."""
    if not views.known_stream(rt.settings, stream):
        raise HTTPException(404, detail=f"{stream!r} is not one of the configured streams")
    try:
        _, rows = await views.group_consumers(
            rt, stream=stream, name=group, after=after, limit=limit
        )
    except LookupError as exc:
        raise HTTPException(404, detail=str(exc)) from None
    if len(rows) == limit:
        link_next(request, response, rows[-1].name)
    return [
        schemas.GroupConsumerView(
            name=row.name,
            pending=row.pending,
            idle_ms=row.idle_ms,
            agent_id=row.agent,
            down=bool(row.down_reasons),
            down_reasons=list(row.down_reasons),
            degraded=row.degraded,
            heartbeat_age_ms=row.heartbeat_age_ms,
        )
        for row in rows
    ]


@router.post(
    "/reaper/scan",
    response_class=Response,
    responses={
        200: {"model": ScanReport, "description": "the scan report"},
        403: {
            "model": schemas.Problem,
            "description": "a real scan asked by a role that may not change things",
        },
        409: {"model": schemas.Problem, "description": "not the active reaper"},
    },
)
async def scan_now(
    rt: Annotated[Runtime, Depends(runtime)],
    who: Annotated[roles.Caller, Depends(caller)],
    dry_run: Annotated[bool | None, Query(alias="dryRun")] = None,
) -> Response:
    """Run one scan now and return its report: requests that arrive while a scan of the same
    kind runs share the next one (never scans side by side, never one per request). A dry run
    changes nothing and any role may ask for one; a real scan is a change (operator tokens). Without
    `dryRun`, RIG_DRY_RUN decides: a conductor set to change nothing does not change things
    because a caller left a parameter out."""
    if dry_run is None:
        dry_run = rt.settings.dry_run
    if not dry_run:
        require(rt, who, roles.Need.CHANGE)
    report = await rt.scan(dry_run)
    return Response(report.model_dump_json(by_alias=True), media_type="application/json")
