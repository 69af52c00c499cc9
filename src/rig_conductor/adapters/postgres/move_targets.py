"""The conductor's latest move to each consumer of a group (evidence for rule 5, docs/rules.md).

An XCLAIM resets its target's idle time in the group. Reaper rule 5 must not take that idle time
as a sign that the target is alive, so every move is recorded, after its XCLAIM, by the write
port (`writes.record_move_targets`): a target whose idle time is not shorter than the time
since the record has not touched the group since. Here: the records read, and the old dropped.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.tables import move_targets
from rig_conductor.domain import ConsumerName, GroupName, MoveKey, StreamKey


async def since(conn: AsyncConnection, *, tenant: str, after: datetime) -> dict[MoveKey, datetime]:
    """The latest move to each consumer made after `after`."""
    rows = await conn.execute(
        select(
            move_targets.c.stream,
            move_targets.c.group_name,
            move_targets.c.consumer,
            move_targets.c.moved_at,
        ).where(move_targets.c.tenant == tenant, move_targets.c.moved_at > after)
    )
    return {(StreamKey(s), GroupName(g), ConsumerName(c)): moved_at for s, g, c, moved_at in rows}


async def forget_older_than(engine: AsyncEngine, *, days: int) -> int:
    """Drop the records of moves made more than `days` ago: their reset idle times are long past."""
    statement = text(
        "DELETE FROM move_targets WHERE moved_at < now() - make_interval(days => :days)"
    )
    async with engine.begin() as conn:
        return (await conn.execute(statement, {"days": days})).rowcount
