"""Dispatches Redis lost (a failover to a replica that never got them, a restart without
persistence) are appended again by the next scan, once, from what PostgreSQL recorded."""

from __future__ import annotations

from collections.abc import Callable

from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches as dispatch_rows
from rig_conductor.adapters.postgres import work
from rig_conductor.adapters.postgres.tables import dispatches, events
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import StreamKey
from rig_conductor.reaper import cycle
from rig_conductor.settings import Settings

from .helpers import port

S = StreamKey("rig:dispatch")


def fields(issue: str) -> dict[str, str]:
    return {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "builder", "payload": "{}"}


async def acknowledged(redis: Redis, engine: AsyncEngine, issue: str) -> str:
    """A dispatch as the API makes it: appended once, then recorded with its fields."""
    entry_id, _ = await redis_writes.append_once(
        redis, stream=S, key=issue, fields=fields(issue), remember_s=3600
    )
    await dispatch_rows.record_dispatch(
        engine, tenant="default", key=issue, issue_id=issue, agent_id="builder",
        stream=S, entry_id=entry_id, fields=fields(issue),
    )  # fmt: skip
    return entry_id


async def test_a_lost_dispatch_is_appended_again_once(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,))
    kept = await acknowledged(redis, engine, "rc-kept")
    lost = await acknowledged(redis, engine, "rc-lost")
    # The failover: the new master never saw rc-lost's entry nor its idempotency marker.
    await redis.xdel(S, lost)
    await redis.delete(redis_keys.dispatched_key(S, "rc-lost"))

    dry = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings, dry=True)
    )
    assert dry.redispatched == 1 and await redis.xlen(S) == 1

    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.redispatched == 1
    rows = await redis.xrange(S)
    assert rows[0][0] == kept
    ((new_id, new_fields),) = [(e, f) for e, f in rows if e != kept]
    assert new_fields == fields("rc-lost")
    assert await redis.get(redis_keys.dispatched_key(S, "rc-lost")) == new_id
    async with engine.connect() as conn:
        recorded = await conn.scalar(
            select(dispatches.c.entry_id).where(dispatches.c.idempotency_key == "rc-lost")
        )
        assigned = (
            await conn.execute(
                select(events.c.entry_id, events.c.detail).where(
                    events.c.kind == "ISSUE_ASSIGNED", events.c.issue_id == "rc-lost"
                )
            )
        ).all()
    assert recorded == new_id
    assert (new_id, {"idempotencyKey": "rc-lost", "replaces": lost}) in [tuple(r) for r in assigned]

    again = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert again.redispatched == 0 and await redis.xlen(S) == 2


async def test_a_dispatch_an_agent_started_is_never_appended_again(
    redis: Redis, engine: AsyncEngine, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(streams=(S,))
    lost = await acknowledged(redis, engine, "rc-started")
    await work.record_work(
        engine,
        tenant="default",
        report=work.WorkReport(
            kind="WORK_STARTED", agent_id="builder", stream=S, entry_id=lost,
            consumer="builder-pod-0", issue_id="rc-started", attempt=None, error=None,
        ),
    )  # fmt: skip
    await redis.xdel(S, lost)
    await redis.delete(redis_keys.dispatched_key(S, "rc-started"))
    report = await cycle.reap_once(
        redis=redis, engine=engine, settings=settings, effects=port(engine, settings)
    )
    assert report.redispatched == 0 and await redis.xlen(S) == 0
