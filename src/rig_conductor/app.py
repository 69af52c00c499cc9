"""`create_app(settings)`: the composition root. Puts the API routes, the console and the
scheduled reaper together in one FastAPI app whose lifespan owns the Redis client, the database
engine, the heartbeat writer, the reaper, and (with Kubernetes on) the pod evidence, the pod
watch and the leader election. Builds and connects; decides nothing itself."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from kubernetes.client import ApiClient
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from rig_conductor import __version__, console, lograte, roles
from rig_conductor.adapters import token_review
from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres.heartbeat_writer import HeartbeatWriter
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.api import errors, heartbeat_lane
from rig_conductor.api.routes import deadletters, events, health, operator, views, work
from rig_conductor.metrics import Metrics
from rig_conductor.reaper import leader
from rig_conductor.reaper.pods import PodEvidence
from rig_conductor.reaper.schedule import ReaperService
from rig_conductor.runtime import Runtime, tokens_of
from rig_conductor.server_timing import ServerTiming
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings,
    *,
    schedule_reaper: bool = True,
    kube: ApiClient | None = None,
    reviewer: token_review.TokenReviewer | None = None,
) -> FastAPI:
    """The conductor's HTTP app.

    `schedule_reaper=False` leaves scans to `/api/reaper/scan` (and elects no leader); `kube` is
    the Kubernetes client (`podwatch.api_client`), None when Kubernetes is off. `reviewer`
    checks pods' ServiceAccount tokens (RIG_K8S_AGENT_AUTH); None: built from the settings.
    """
    metrics = Metrics()
    tokens = tokens_of(settings)
    if reviewer is None:
        reviewer = token_review.build_reviewer(settings, api=kube)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        parts = _Parts(settings, metrics, kube=kube, schedule_reaper=schedule_reaper)
        app.state.runtime = parts.runtime(tokens, app.state.refusal_log)
        await parts.start()
        if tokens.open:
            logger.warning(
                "RIG_ALLOW_ANONYMOUS: no token of any role is set: the /api routes and the "
                "console are open to anyone who can reach them, with operator rights"
            )
        try:
            yield
        finally:
            await parts.stop()

    app = FastAPI(
        title="rig-conductor",
        version=__version__,
        description="Heartbeats, dispatch, and the reaper of stuck Redis Streams entries.",
        lifespan=lifespan,
        # FastAPI's /docs and /redoc pages load their scripts from a CDN: an air-gapped console
        # cannot show them, and a page pulling third-party script has no place beside it. The
        # OpenAPI document stays at /openapi.json for any local viewer or client generator.
        docs_url=None,
        redoc_url=None,
        **fastapi_telemetry(),
    )
    app.state.metrics = metrics
    app.state.refusal_log = lograte.RateLimitedLog()  # one per app: each counts apart
    app.add_middleware(heartbeat_lane.HeartbeatLane)  # first added: innermost
    errors.install(
        app,
        tokens=tokens,
        root_path=settings.http_root_path,
        reviewer=reviewer,
        refusal_log=app.state.refusal_log,
    )
    events.install(app)
    app.include_router(views.router, prefix="/api")
    app.include_router(deadletters.router, prefix="/api")
    app.include_router(work.router, prefix="/api")
    app.include_router(operator.router, prefix="/api")
    app.include_router(health.router)
    console.install(app, tokens=tokens)
    app.add_middleware(ServerTiming)  # console pages and /api views: the time to answer
    if settings.forwarded_allow_ips:
        # Outermost: the client address (the throttles, the request log) and the scheme (the
        # console cookie's Secure flag) of every layer come from the trusted proxies'
        # X-Forwarded-For / X-Forwarded-Proto, and from nobody else's.
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=list(settings.forwarded_allow_ips))
    return app


def fastapi_telemetry() -> dict[str, Any]:
    """FastAPI's `telemetry` argument: its own OpenTelemetry (spans, metrics and logs of every
    request) off where no OpenTelemetry SDK is installed, else as FastAPI sets it up (no
    argument). Only an SDK can configure the providers it reports to, and while it is on,
    FastAPI looks the three up on every request to see whether one has been: 4% of a
    heartbeat's CPU, for nothing without an SDK. A FastAPI older than its own telemetry takes
    no such argument."""
    if importlib.util.find_spec("fastapi.telemetry") is None:
        return {}
    if importlib.util.find_spec("opentelemetry.sdk") is not None:  # the API comes with FastAPI
        return {}
    return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}


def stop_listening(app: object) -> None:
    """The server in front of `app` takes no more connections: its graceful shutdown began.

    This replica marks itself as listening no more from now, not once the requests in flight
    have finished (that may take up to the server's graceful timeout): heartbeats sent meanwhile
    are refused, and that time is blind (rule 3, docs/rules.md), not time in which the agents'
    heartbeats could have landed. A no-op for another app, or before the lifespan has started.
    """
    runtime = getattr(getattr(app, "state", None), "runtime", None)
    if runtime is not None:
        runtime.heartbeats.stop_marking()


class _Parts:
    """What the app's lifespan owns: built and wired here, started and stopped in order."""

    def __init__(
        self, settings: Settings, metrics: Metrics, *, kube: ApiClient | None, schedule_reaper: bool
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.redis = redis_client.connect(settings)
        self.topology = redis_client.Topology(self.redis, settings)
        self.engine = pg.create_engine(settings.sqlalchemy_url)
        self.heartbeats = HeartbeatWriter(
            settings.sqlalchemy_url,
            tenant=settings.tenant,
            replica=leader.replica_identity(),
            slack_ms=settings.limits.listen_slack_ms,
            break_ms=settings.agent_down_ms,
            on_commit=lambda batch: metrics.heartbeats_stored([hb.agent_id for hb in batch]),
            on_spell_end=lambda spell: metrics.blind_spells.inc(
                (spell.end - spell.start).total_seconds()
            ),
        )
        pods = PodEvidence(settings, kube, self.engine) if kube is not None else None
        self.pods = pods
        self.elector = (
            leader.make_elector(
                settings=settings, api=kube, on_change=pods.follow if pods else None
            )
            if schedule_reaper
            else None
        )
        self.reaper = ReaperService(
            redis=self.topology,
            engine=self.engine,
            settings=settings,
            metrics=metrics,
            pods=pods,
            elector=self.elector,
        )
        if pods is not None:
            pods.on_gone = self.reaper.on_pod_gone

    def runtime(self, tokens: roles.Tokens, refusal_log: lograte.RateLimitedLog) -> Runtime:
        """What the routes and the console reach through `app.state.runtime`."""
        return Runtime(
            self.settings,
            self.redis,
            self.engine,
            self.heartbeats,
            self.reaper.scan_now,
            self.metrics,
            schema_head=pg.SCHEMA_HEAD,
            measure=self.reaper.measure,
            topology=self.topology,
            tokens=tokens,
            pods=self.pods,
            refusal_log=refusal_log,
        )

    async def start(self) -> None:
        self.heartbeats.start()
        if self.elector is not None:  # there is one exactly when scans are scheduled
            await self.elector.start()
            self.reaper.start()

    async def stop(self) -> None:
        # The server takes no more requests once its shutdown reaches here (under `serve` and
        # `demo` the marks stopped earlier, with the connections: `stop_listening`), so this
        # replica stops marking itself as listening first: a scan still running may take
        # seconds to finish, and that time counts as blind (rule 3, docs/rules.md), not as time
        # in which the agents' heartbeats could have landed.
        await self.heartbeats.stop()
        if self.pods is not None:
            await self.pods.follow(False)
        await self.reaper.stop()
        if self.elector is not None:
            await self.elector.stop()  # hands leadership over at once
        await self.topology.aclose()
        await self.redis.aclose()
        await self.engine.dispose()
        logger.info("Shut down cleanly")
