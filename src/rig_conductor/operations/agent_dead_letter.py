"""DEAD_LETTER: an agent asks the conductor to dead-letter an entry it holds.

Agents never write the dead-letter stream (their Redis users cannot). The conductor does it
for them, exactly as reaper step 7 does, when the asking consumer holds the entry in the named
group and the entry is worn out (its delivery count reached RIG_MAX_DELIVERIES) or gone from
the stream (trimmed or deleted). An entry whose completion was accepted is not dead-lettered:
the answer says it is done, with its outputs still to publish, and the agent publishes and acks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rig_conductor.adapters.postgres import work
from rig_conductor.adapters.redis import holders as redis_holders
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import AgentId, ConsumerName, EntryId, GroupName, StreamKey
from rig_conductor.effects import port
from rig_conductor.runtime import Runtime

Reason = Literal["max-deliveries", "trimmed"]


@dataclass(frozen=True, slots=True)
class Request:
    agent_id: AgentId
    consumer: ConsumerName
    stream: StreamKey
    group: GroupName
    entry_id: EntryId
    reason: Reason


@dataclass(frozen=True, slots=True)
class Refused:
    why: str


@dataclass(frozen=True, slots=True)
class Done:
    """Not dead-lettered: the entry's completion was accepted."""

    finished: work.WorkOutcome


Outcome = redis_streams.DeadLettered | Refused | Done


async def dead_letter(rt: Runtime, request: Request) -> Outcome:
    held = await redis_holders.held_in_group(
        rt.redis, stream=request.stream, group=request.group, entry_id=request.entry_id
    )
    if held is None or held[0] != request.consumer:
        return Refused(
            f"consumer {request.consumer} does not hold entry {request.entry_id} in group "
            f"{request.group} of {request.stream}"
        )
    deliveries = held[1]
    if (why := await _not_worn(rt, request, deliveries)) is not None:
        return Refused(why)
    finished = await work.finished(
        rt.engine,
        tenant=rt.settings.tenant,
        stream=request.stream,
        group=request.group,
        entry_id=request.entry_id,
    )
    if finished is not None:
        return Done(finished)
    effects = port.choose(False, engine=rt.engine, tenant=rt.settings.tenant)
    done = await effects.dead_letter_held(
        rt.redis,
        stream=request.stream,
        group=request.group,
        consumer=request.consumer,
        agent_id=request.agent_id,
        entry_id=request.entry_id,
        deliveries=deliveries,
        reason=request.reason,
    )
    if done is None:
        return Refused(f"entry {request.entry_id} was moved or acked meanwhile")
    return done


async def _not_worn(rt: Runtime, request: Request, deliveries: int) -> str | None:
    """Why the entry may not be dead-lettered for `request.reason` (None: it may)."""
    limit = rt.settings.max_deliveries
    if request.reason == "max-deliveries":
        if deliveries < limit:
            return (
                f"entry {request.entry_id} was delivered {deliveries} times, fewer than "
                f"RIG_MAX_DELIVERIES ({limit})"
            )
        return None
    if await redis_holders.entry_exists(rt.redis, stream=request.stream, entry_id=request.entry_id):
        return f"entry {request.entry_id} is still in {request.stream}: it was not trimmed"
    return None
