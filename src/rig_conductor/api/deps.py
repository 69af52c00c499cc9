"""What routes share: the runtime (clients, writer, reaper) and the bearer-token check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
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


async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value
