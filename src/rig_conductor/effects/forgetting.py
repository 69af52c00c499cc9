"""The registry kept bounded: the heartbeat rows of agents and consumers silent past
RIG_AGENT_FORGET_MS deleted, but for those `policy.registry` keeps, and one line saying how
many. Whom to forget is decided before (`registry.plan_forgetting`)."""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.policy import registry

logger = logging.getLogger(logs.RECLAIM_LOGGER)  # the scan's line, as when it wrote it itself


async def forget(
    plan: registry.Forget, *, forget_ms: int, engine: AsyncEngine, tenant: str
) -> None:
    agents, consumers = await pg_writes.forget_silent(
        engine,
        tenant=tenant,
        before=plan.before,
        keep_agents=plan.keep_agents,
        keep_consumers=plan.keep_consumers,
    )
    if agents or consumers:
        logger.info(
            "Registry: forgot %d agents and %d consumers not heard from for %d ms",
            agents,
            consumers,
            forget_ms,
        )
