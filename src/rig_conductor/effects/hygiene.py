"""Consumer hygiene's writes: the consumers `policy.hygiene` found removable deleted from their
groups (guarded against an entry arriving meanwhile), each with its `[ConsumerHygiene]` line.
Which consumers qualify is decided before (`reaper.cleanup`); a dry run logs what it would
delete (`would_remove`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from redis.asyncio import Redis

from rig_conductor import logs
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.policy import hygiene

# The lines keep the logger they had when the reaper wrote them itself: operators filter on it.
logger = logging.getLogger(logs.HYGIENE_LOGGER)


async def remove(
    client: Redis, removals: Sequence[hygiene.ConsumerRemoval]
) -> list[hygiene.ConsumerRemoval]:
    """Delete the consumers of `removals` that still hold nothing, a line each; the deleted."""
    done = await delete_consumers(client, removals=removals)
    _log(done, "Deleted")
    return done


def would_remove(removals: Sequence[hygiene.ConsumerRemoval]) -> list[hygiene.ConsumerRemoval]:
    """A dry run's lines for the consumers it would delete; all of them."""
    _log(removals, "DRY RUN: would delete")
    return list(removals)


async def delete_consumers(
    client: Redis, *, removals: Sequence[hygiene.ConsumerRemoval]
) -> list[hygiene.ConsumerRemoval]:
    """XGROUP DELCONSUMER each consumer that still holds nothing; returns the ones deleted.

    A consumer that received an entry since the plan was made is refused atomically (see
    `redis_writes.delete_empty_consumers`); a group or stream deleted meanwhile is skipped.
    """
    outcomes = await redis_writes.delete_empty_consumers(
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


def _log(removals: Sequence[hygiene.ConsumerRemoval], verb: str) -> None:
    for removal in removals:
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
