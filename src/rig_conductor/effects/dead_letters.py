"""A dead letter an agent asks for: copied to the stream's dead-letter stream and acked, logged
and recorded exactly as reaper step 7's. Agents never write the dead-letter stream themselves;
`operations.agent_dead_letter` decides whether to ask this."""

from __future__ import annotations

import json
import logging

from rig_conductor import logs
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.domain import (
    ConsumerName,
    EntryId,
    EventKind,
    GroupName,
    PendingEntry,
    StreamKey,
)
from rig_conductor.effects.journal import Journal

logger = logging.getLogger(logs.RECLAIM_LOGGER)


async def dead_letter_held(
    redis: AnyRedis,
    journal: Journal,
    *,
    stream: StreamKey,
    group: GroupName,
    consumer: ConsumerName,
    agent_id: str,
    entry_id: EntryId,
    deliveries: int,
    reason: str,
) -> redis_streams.DeadLettered | None:
    """Dead-letter `entry_id` if `consumer` still holds it in `group` (None: it does not any
    more, and nothing was written). One `[StreamReclaim] Dead-lettered` line, one DEAD_LETTERED
    row, the assignment marked dead."""
    entry = PendingEntry(entry_id, consumer, 0, deliveries)
    done = await redis_streams.dead_letter(
        redis, stream=stream, group=group, entries=[entry], reason=reason
    )
    if not done:
        return None
    item = done[0]
    dlq_stream = redis_streams.dlq_key(stream, redis)
    log_dead_lettered(stream, group, consumer, item, reason=reason)
    detail = {
        "deliveries": item.deliveries,
        "reason": reason,
        "dlqStream": dlq_stream,
        "dlqId": item.dlq_id,
        "askedBy": consumer,
    }
    row = queries.EventRow(
        EventKind.DEAD_LETTERED,
        agent_id=agent_id,
        consumer=consumer,
        stream=stream,
        group_name=group,
        entry_id=item.entry_id,
        issue_id=item.issue_id,
        detail=json.dumps(detail),
    )
    await queries.append_events(journal.engine, tenant=journal.tenant, rows=[row])
    await work.dead_lettered(
        journal.engine,
        tenant=journal.tenant,
        stream=stream,
        group=group,
        entries=[(item.entry_id, item.issue_id, item.deliveries)],
    )
    return item


def log_dead_lettered(
    stream: StreamKey,
    group: GroupName,
    consumer: ConsumerName,
    item: redis_streams.DeadLettered,
    *,
    reason: str | None = None,
) -> None:
    """The line of rule 8 (docs/rules.md) for one dead letter, the scan's and an agent's alike."""
    extra: dict[str, object] = {
        "entryId": item.entry_id,
        "stream": stream,
        "group": group,
        "consumer": consumer,
        "deliveries": item.deliveries,
        "dlqId": item.dlq_id,
    }
    if reason is not None:
        extra["reason"] = reason
    logger.info(
        "[StreamReclaim] Dead-lettered %s on %s after %d deliveries",
        item.entry_id,
        stream,
        item.deliveries,
        extra=extra,
    )
