"""What routes share: the runtime (clients, writer, reaper) and the bearer-token check."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException, Request, status
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.api.ingest import HeartbeatWriter
from rig_conductor.metrics import Metrics
from rig_conductor.settings import Settings

# Runs one scan now (after any scan in progress) and returns its report as JSON.
ScanNow = Callable[[bool | None], Awaitable[dict[str, Any]]]


@dataclass
class Runtime:
    settings: Settings
    redis: Redis
    engine: AsyncEngine
    heartbeats: HeartbeatWriter
    scan: ScanNow
    metrics: Metrics
    schema_head: str | None


def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


def require_token(request: Request) -> None:
    """With RIG_API_TOKENS set, every /api call needs `Authorization: Bearer <token>`."""
    tokens: tuple[bytes, ...] = request.app.state.tokens
    if not tokens:
        return
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    candidate = presented.strip().encode()
    # Compare against every token, so timing does not reveal which one came close.
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(candidate, token)
    if scheme.lower() != "bearer" or not matched:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
