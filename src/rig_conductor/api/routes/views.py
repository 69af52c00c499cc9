"""Operator views: agents, streams, and a scan on demand."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response

from rig_conductor import domain, roles
from rig_conductor.adapters import redis_reading
from rig_conductor.adapters.postgres import queries
from rig_conductor.api import schemas
from rig_conductor.api.deps import Runtime, caller, require, runtime
from rig_conductor.domain import AgentId
from rig_conductor.operations import views
from rig_conductor.policy import agents as agent_policy
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
        _link_next(request, response, rows[-1].agent_id)
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
        _link_next(request, response, row.consumers[-1])
    return _agent_view(row)


def _link_next(request: Request, response: Response, last: str) -> None:
    """The next page, as a reference relative to this one (query only), so it holds under
    RIG_HTTP_ROOT_PATH whether the ingress strips the prefix or not."""
    query = request.url.include_query_params(after=last).query
    response.headers["Link"] = f'<?{query}>; rel="next"'


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
async def list_streams(rt: Annotated[Runtime, Depends(runtime)]) -> list[schemas.GroupView]:
    """Per stream and group: consumers with pending count, idle time and resolved agent."""
    world = await redis_reading.read(rt.servers(), rt.settings.streams)
    groups = world.groups
    _, rows = await queries.list_agents(rt.engine, tenant=rt.settings.tenant)
    known = agent_policy.known_agents(rt.settings.agent_ids, (AgentId(r.agent_id) for r in rows))
    return [
        schemas.GroupView(
            stream=group.stream,
            group=group.name,
            pending=group.pending,
            oldest_pending_idle_ms=group.oldest_idle_ms,
            consumers=[
                schemas.ConsumerView(
                    name=c.name,
                    pending=c.pending,
                    idle_ms=c.idle_ms,
                    agent_id=agent_policy.resolve_agent(c.name, known),
                )
                for c in group.consumers
            ],
        )
        for group in groups
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
    """Run one scan now (after any scan in progress) and return its report. A dry run changes
    nothing and any role may ask for one; a real scan is a change (operator tokens). Without
    `dryRun`, RIG_DRY_RUN decides: a conductor set to change nothing does not change things
    because a caller left a parameter out."""
    if dry_run is None:
        dry_run = rt.settings.dry_run
    if not dry_run:
        require(rt, who, roles.Need.CHANGE)
    report = await rt.scan(dry_run)
    return Response(report.model_dump_json(by_alias=True), media_type="application/json")
