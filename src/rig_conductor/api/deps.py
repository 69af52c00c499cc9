"""What routes share: the runtime (clients, writer, reaper) and the bearer-token check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.redis_client import AnyRedis, Topology
from rig_conductor.api.ingest import HeartbeatWriter
from rig_conductor.metrics import Metrics
from rig_conductor.settings import Settings

# Runs one scan now (after any scan in progress) and returns its report as JSON.
ScanNow = Callable[[bool | None], Awaitable[dict[str, Any]]]


@dataclass
class Runtime:
    settings: Settings
    redis: AnyRedis
    engine: AsyncEngine
    heartbeats: HeartbeatWriter
    scan: ScanNow
    metrics: Metrics
    schema_head: str | None
    # The servers holding streams (each primary of a cluster), for views that read them all.
    topology: Topology | None = None

    def servers(self) -> Topology:
        if self.topology is None:
            self.topology = Topology(self.redis, self.settings)
        return self.topology


async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value
