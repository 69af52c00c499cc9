"""What the registry holds of one agent's consumers, for the limit on how many it may register
(RIG_MAX_CONSUMERS_PER_AGENT). Reads only; the heartbeat intake writes the rows."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.domain import AgentId, ConsumerName


@dataclass(frozen=True, slots=True)
class Standing:
    registered: bool  # the consumer is in the registry, for this agent
    consumers: int  # how many the agent has, counted up to the limit asked about


# Both from the index on (tenant, agent_id, consumer); the count stops at :upto, so an agent
# with a million rows costs what one at the limit does.
_STANDING = text("""
    SELECT EXISTS (SELECT 1 FROM consumer_heartbeats
                    WHERE tenant = :tenant AND agent_id = :agent AND consumer = :consumer),
           (SELECT count(*) FROM (SELECT 1 FROM consumer_heartbeats
                                   WHERE tenant = :tenant AND agent_id = :agent
                                   LIMIT :upto) AS upto)
""")


async def standing(
    engine: AsyncEngine, *, tenant: str, agent: AgentId, consumer: ConsumerName, upto: int
) -> Standing:
    """Whether `consumer` is registered for `agent`, and how many consumers `agent` has (at
    most `upto` counted)."""
    params = {"tenant": tenant, "agent": agent, "consumer": consumer, "upto": upto}
    async with engine.connect() as conn:
        registered, consumers = (await conn.execute(_STANDING, params)).one()
    return Standing(bool(registered), int(consumers))
