"""Consumer hygiene after a scan: delete the consumers whose pod is gone and that hold nothing.

Which consumers qualify is `policy.hygiene`'s decision, made on the scan's own reading of the
groups and the evidence; this module has Redis delete them (guarded against an entry arriving
meanwhile) and logs `[ConsumerHygiene]`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from redis.asyncio import Redis

from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.domain import Evidence, GroupInfo, Limits
from rig_conductor.policy import hygiene

logger = logging.getLogger(__name__)


async def delete_consumers(
    client: Redis, *, removals: Sequence[hygiene.ConsumerRemoval]
) -> list[hygiene.ConsumerRemoval]:
    """XGROUP DELCONSUMER each consumer that still holds nothing; returns the ones deleted.

    A consumer that received an entry since the plan was made is refused atomically (see
    `redis_streams.delete_empty_consumers`); a group or stream deleted meanwhile is skipped.
    """
    outcomes = await redis_streams.delete_empty_consumers(
        client, consumers=[(r.stream, r.group, r.consumer) for r in removals]
    )
    deleted: list[hygiene.ConsumerRemoval] = []
    for removal, outcome in zip(removals, outcomes, strict=True):
        if outcome is None:
            deleted.append(removal)
        else:
            logger.info(
                "Consumer %s of %s/%s not deleted: %s",
                removal.consumer,
                removal.stream,
                removal.group,
                outcome,
            )
    return deleted


async def remove_consumers(
    *,
    redis: Redis,
    groups: Sequence[GroupInfo],
    evidence: Evidence,
    limits: Limits,
    dry_run: bool = False,
) -> list[hygiene.ConsumerRemoval]:
    """Delete the consumers `policy.hygiene` finds removable in the scan's own reading of the
    groups and the evidence; returns them (planned, in a dry run). Reads nothing itself."""
    plan = hygiene.plan_removals(list(groups), evidence, limits)
    done = plan if dry_run else await delete_consumers(redis, removals=plan)
    verb = "DRY RUN: would delete" if dry_run else "Deleted"
    for removal in done:
        logger.info(
            "[ConsumerHygiene] %s consumer %s of %s/%s: pod gone, no fresh heartbeat, "
            "nothing pending, idle %d ms",
            verb,
            removal.consumer,
            removal.stream,
            removal.group,
            removal.idle_ms,
            extra={
                "stream": removal.stream,
                "group": removal.group,
                "consumer": removal.consumer,
                "agent": removal.agent,
            },
        )
    return done
