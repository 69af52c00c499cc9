"""The API and the reaper start from one list of agents (RIG_AGENT_IDS and the holders of
RIG_AGENT_TOKENS), and the API's memory of the agents it heard forgets what the registry
forgets. Real Redis and PostgreSQL."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake, queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.operations.reports import KnownAgents
from rig_conductor.reaper.cycle import reap_once
from rig_conductor.settings import Settings

from .helpers import fill, owners, port, read, register

S, G = "rig:dispatch", "workers"


async def test_an_agent_named_only_by_its_token_is_known_to_the_reaper(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    """dev-e holds a bound token and never heartbeated: down, so its consumer's entries move.
    Were dev-e unknown, dev-e-0 would be judged by its own (fresh) reading and keep them."""
    ids = await fill(redis, S, G, 2)
    await read(redis, S, G, "dev-e-0", 2)
    await register(redis, S, G, "zz-0")  # of no known agent: alive by its own reading
    settings = make_settings(
        streams=(S,), agent_tokens="dev-e:dev-e-token-0123456789", entry_stale_ms=0
    )
    assert settings.agent_ids == ()  # named by its token only
    report = await reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.reclaimed == 2
    assert await owners(redis, S, G) == dict.fromkeys(ids, "zz-0")


async def test_the_api_forgets_an_agent_the_registry_forgot(engine: AsyncEngine) -> None:
    now = [0.0]
    known = KnownAgents(
        functools.partial(queries.agent_ids, engine, tenant="default"),
        configured=["dev-e"],
        clock=lambda: now[0],
    )
    await known.index()  # the registry is fresh: what is heard now is kept until the next read
    beat = intake.HeartbeatIn(AgentId("gone-e"), ConsumerName("gone-e-0"))
    await intake.record_heartbeats(engine, tenant="default", heartbeats=[beat])
    known.heard("gone-e")
    assert (await known.index()).resolve(ConsumerName("gone-e-0")) == "gone-e"
    now[0] += 10  # read again: gone-e is in the registry
    assert (await known.index()).resolve(ConsumerName("gone-e-0")) == "gone-e"
    # The reaper forgets it (RIG_AGENT_FORGET_MS); the next read of the registry lacks it.
    later = datetime.now(UTC) + timedelta(minutes=1)
    forgotten = await pg_writes.forget_silent(
        engine, tenant="default", before=later, keep_agents=(), keep_consumers=()
    )
    assert forgotten == (1, 1)
    now[0] += 10
    index = await known.index()
    assert index.resolve(ConsumerName("gone-e-0")) is None
    assert index.resolve(ConsumerName("dev-e-0")) == "dev-e"  # configured agents stay


async def test_agents_heard_while_nobody_asks_are_not_kept(engine: AsyncEngine) -> None:
    known = KnownAgents(
        functools.partial(queries.agent_ids, engine, tenant="default"), configured=()
    )
    for n in range(1000):
        known.heard(f"agent-{n}")  # a fleet on unbound tokens: nobody asks for the index
    assert len(known._heard) == 0
