"""What the HTTP routes and the console share while `serve` runs: the clients, the heartbeat
writer, the metrics and a way to run a scan now. Built by `app.py`; the routes reach the reaper
only through `scan`."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import lograte, roles
from rig_conductor.adapters.postgres import queries, registrations
from rig_conductor.adapters.postgres.heartbeat_writer import HeartbeatWriter
from rig_conductor.adapters.redis.client import AnyRedis, Topology
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.metrics import Metrics
from rig_conductor.operations.evidence import PodSource
from rig_conductor.operations.registrations import ConsumerLimit
from rig_conductor.operations.reports import KnownAgents
from rig_conductor.scan_report import ScanReport
from rig_conductor.settings import Settings

# Runs one scan now (shared with the requests that arrive with it: `reaper.coalesce`) and
# returns its report; raises
# `domain.NotLeading` for a non-dry scan on a replica that is not the active reaper.
ScanNow = Callable[[bool | None], Awaitable[ScanReport]]
# Runs a dry-run scan for the views (its report not kept among the last scans).
MeasureNow = Callable[[], Awaitable[None]]


@dataclass
class Runtime:
    settings: Settings
    redis: AnyRedis
    engine: AsyncEngine
    heartbeats: HeartbeatWriter
    scan: ScanNow
    metrics: Metrics
    schema_head: str | None
    measure: MeasureNow
    # The servers holding streams (each primary of a cluster), for views that read them all.
    topology: Topology | None = None
    tokens: roles.Tokens | None = None
    # What Kubernetes says about the pods consumers are named after, the scan's own source of
    # it (`operations.evidence`); None with Kubernetes off.
    pods: PodSource | None = None
    # Lines about refused requests, at a bounded rate (the app's, shared with its middleware).
    refusal_log: lograte.RateLimitedLog = field(default_factory=lograte.RateLimitedLog)
    # The agents consumer names resolve against when a bound credential speaks.
    known_agents: KnownAgents = field(init=False)
    # How many consumers each agent may register (RIG_MAX_CONSUMERS_PER_AGENT).
    consumers: ConsumerLimit = field(init=False)
    # Held while a view measures the fleet anew (`operations.measured.fresh`): one at a time.
    measuring: asyncio.Lock = field(init=False, default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.known_agents = KnownAgents(
            functools.partial(queries.agent_ids, self.engine, tenant=self.settings.tenant),
            configured=self.settings.known_agents,  # the reaper's list too
        )
        tenant = self.settings.tenant

        async def standing(
            agent: AgentId, consumer: ConsumerName, upto: int
        ) -> registrations.Standing:
            return await registrations.standing(
                self.engine, tenant=tenant, agent=agent, consumer=consumer, upto=upto
            )

        self.consumers = ConsumerLimit(
            standing,
            limit=self.settings.max_consumers_per_agent,
            remember_s=self.settings.agent_forget_ms / 1000,
        )

    def servers(self) -> Topology:
        if self.topology is None:
            self.topology = Topology(self.redis, self.settings)
        return self.topology


def tokens_of(settings: Settings) -> roles.Tokens:
    """The tokens of the three roles, keyed by RIG_SESSION_SECRET (empty: a random key for this
    process)."""

    def raw(values: tuple[Any, ...]) -> list[bytes]:
        return [v.get_secret_value().encode() for v in values]

    secret = settings.session_secret
    return roles.Tokens(
        agent=raw(settings.api_tokens),
        operator=raw(settings.operator_tokens),
        viewer=raw(settings.viewer_tokens),
        bound=settings.bound_tokens,
        agent_auth=settings.k8s_agent_auth,
        secret=secret.get_secret_value().encode() if secret is not None else None,
    )
