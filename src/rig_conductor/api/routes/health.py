"""Liveness and readiness probes (no token)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.api.deps import Runtime, runtime

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """200 while the process runs."""
    return {"status": "ok"}


@router.get(
    "/readyz", responses={503: {"description": "a dependency is down or the schema is behind"}}
)
async def readyz(rt: Annotated[Runtime, Depends(runtime)]) -> JSONResponse:
    """200 when Redis and PostgreSQL answer and the schema is at this release's head."""
    checks: dict[str, str] = {}
    try:
        await rt.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"unavailable: {type(exc).__name__}"
    try:
        version = await pg_engine.applied_revision(rt.engine)
        checks["postgres"] = "ok"
        if version is None:
            checks["schema"] = f"not migrated, needs {rt.schema_head}"
        else:
            checks["schema"] = (
                "ok" if version == rt.schema_head else f"at {version}, needs {rt.schema_head}"
            )
    except Exception as exc:
        checks["postgres"] = f"unavailable: {type(exc).__name__}"
        checks["schema"] = "unknown"
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    """Prometheus text exposition of the contract's metric families."""
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
