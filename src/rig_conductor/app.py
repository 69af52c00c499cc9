"""`create_app(settings)`: the composition root. Puts the API routes and the scheduled reaper
together in one FastAPI app whose lifespan owns the Redis client, the database engine, the
heartbeat writer, the reaper, and (with Kubernetes on) the pod evidence, the pod watch and the
leader election. The API reaches the reaper only through `Runtime.scan`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from kubernetes.client import ApiClient
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import __version__
from rig_conductor.adapters import redis_client
from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres import migrations
from rig_conductor.api import errors
from rig_conductor.api.deps import Runtime
from rig_conductor.api.ingest import HeartbeatWriter
from rig_conductor.api.routes import deadletters, events, health, views
from rig_conductor.domain import PodName
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import leader, podwatch
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings, *, schedule_reaper: bool = True, kube: ApiClient | None = None
) -> FastAPI:
    """The conductor's HTTP app.

    `schedule_reaper=False` leaves scans to `/api/reaper/scan` (and elects no leader); `kube` is
    the Kubernetes client (`podwatch.api_client`), None when Kubernetes is off.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        redis = redis_client.connect(settings)
        topology = redis_client.Topology(redis, settings)
        engine = pg.create_engine(settings.sqlalchemy_url)
        heartbeats = HeartbeatWriter(
            settings.sqlalchemy_url,
            tenant=settings.tenant,
            on_commit=lambda batch: metrics.heartbeats_stored([hb.agent_id for hb in batch]),
        )
        pods = _Pods(settings, kube, engine) if kube is not None else None
        elector = (
            leader.make_elector(
                settings=settings, api=kube, on_change=pods.follow if pods else None
            )
            if schedule_reaper
            else None
        )
        reaper = ReaperService(
            redis=topology,
            engine=engine,
            settings=settings,
            metrics=metrics,
            pods=pods.liveness if pods else None,
            tracker=pods.tracker if pods else None,
            elector=elector,
        )
        if pods is not None:
            pods.on_gone = reaper.on_pod_gone

        async def scan(dry_run: bool | None) -> dict[str, Any]:
            if not reaper.leading and not (settings.dry_run if dry_run is None else dry_run):
                raise HTTPException(409, detail="this replica is not the active reaper")
            return (await reaper.scan(dry_run=dry_run)).to_json()

        app.state.runtime = Runtime(
            settings,
            redis,
            engine,
            heartbeats,
            scan,
            metrics,
            schema_head=migrations.head_revision(settings.sqlalchemy_url),
            topology=topology,
        )
        heartbeats.start()
        if elector is not None:
            await elector.start()
        if schedule_reaper:
            reaper.start()
        if not settings.api_tokens:
            logger.warning(
                "RIG_API_TOKENS is empty: the /api routes are open to anyone who can reach them"
            )
        try:
            yield
        finally:
            if pods is not None:
                await pods.follow(False)
            await reaper.stop()
            if elector is not None:
                await elector.stop()  # hands leadership over at once
            await heartbeats.stop()
            await topology.aclose()
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
    events.install(app)
    app.include_router(views.router, prefix="/api")
    app.include_router(deadletters.router, prefix="/api")
    app.include_router(health.router)
    return app


class _Pods:
    """Kubernetes evidence: one tracker shared by the per-scan listing and the watch. The watch
    runs only while this replica leads."""

    def __init__(self, settings: Settings, kube: ApiClient, engine: AsyncEngine) -> None:
        namespace, selector = settings.namespace(), settings.k8s_label_selector
        self.tracker = podwatch.PodTracker()
        self.liveness = podwatch.PodLiveness(
            api=kube,
            namespace=namespace,
            label_selector=selector,
            tracker=self.tracker,
            engine=engine,
            tenant=settings.tenant,
        )
        self.on_gone: Callable[[PodName], Awaitable[None]] | None = None
        self._watch = podwatch.PodWatch(
            api=kube,
            namespace=namespace,
            label_selector=selector,
            on_gone=self._gone,
            tracker=self.tracker,
        )

    async def _gone(self, pod: PodName) -> None:
        if self.on_gone is not None:
            await self.on_gone(pod)

    async def follow(self, leading: bool) -> None:
        if leading and not self._watch.running:
            await self._watch.start()
        elif not leading and self._watch.running:
            await self._watch.stop()
