"""`create_app(settings)`: the composition root. Puts the API routes and the scheduled reaper
together in one FastAPI app whose lifespan owns the Redis client, the database engine, the
heartbeat writer and the reaper. The API reaches the reaper only through `Runtime.scan`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from rig_conductor import __version__
from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres import migrations
from rig_conductor.api import errors
from rig_conductor.api.deps import Runtime
from rig_conductor.api.ingest import HeartbeatWriter
from rig_conductor.api.routes import deadletters, events, health, views
from rig_conductor.metrics import Metrics
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)


def create_app(settings: Settings, *, schedule_reaper: bool = True) -> FastAPI:
    """The conductor's HTTP app. `schedule_reaper=False` leaves scans to `/api/reaper/scan`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = redis_streams.connect(settings.redis_url)
        engine = pg.create_engine(settings.sqlalchemy_url)
        heartbeats = HeartbeatWriter(settings.sqlalchemy_url, tenant=settings.tenant)
        reaper = ReaperService(redis=redis, engine=engine, settings=settings, metrics=metrics)

        async def scan(dry_run: bool | None) -> dict[str, Any]:
            return (await reaper.scan(dry_run=dry_run)).to_json()

        app.state.runtime = Runtime(
            settings,
            redis,
            engine,
            heartbeats,
            scan,
            metrics,
            schema_head=migrations.head_revision(settings.sqlalchemy_url),
        )
        heartbeats.start()
        if schedule_reaper:
            reaper.start()
        if not settings.api_tokens:
            logger.warning(
                "RIG_API_TOKENS is empty: the /api routes are open to anyone who can reach them"
            )
        try:
            yield
        finally:
            await reaper.stop()
            await heartbeats.stop()
            await redis.aclose()
            await engine.dispose()
            logger.info("Shut down cleanly")

    metrics = Metrics()
    app = FastAPI(
        title="rig-conductor",
        version=__version__,
        description="Heartbeats, dispatch, and the reaper of stuck Redis Streams entries.",
        lifespan=lifespan,
    )
    app.state.metrics = metrics
    errors.install(app, tokens=tuple(t.get_secret_value().encode() for t in settings.api_tokens))
    app.include_router(events.router, prefix="/api")
    app.include_router(views.router, prefix="/api")
    app.include_router(deadletters.router, prefix="/api")
    app.include_router(health.router)
    return app
