"""Consumer hygiene after a scan: the consumers whose pod is gone and that hold nothing go.

Which consumers qualify is `policy.hygiene`'s decision, made on the scan's own reading of the
groups and the evidence; the write port deletes them (guarded against an entry arriving
meanwhile) and logs `[ConsumerHygiene]` (`effects.hygiene`; a dry run's logs what it would).
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from rig_conductor.domain import Evidence, GroupInfo, Limits
from rig_conductor.effects.port import Effects
from rig_conductor.policy import hygiene


async def remove_consumers(
    *,
    redis: Redis,
    groups: Sequence[GroupInfo],
    evidence: Evidence,
    limits: Limits,
    effects: Effects,
) -> list[hygiene.ConsumerRemoval]:
    """Remove the consumers `policy.hygiene` finds removable in the scan's own reading of the
    groups and the evidence; returns them (planned, in a dry run). Reads nothing itself."""
    plan = hygiene.plan_removals(list(groups), evidence, limits)
    return await effects.remove_consumers(redis, plan)
