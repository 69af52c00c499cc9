"""The writes of dead letters besides the scan's: one an agent asks for (copied to the stream's
dead-letter stream and acked, logged and recorded exactly as reaper step 7's; agents never write
the dead-letter stream themselves, `operations.agent_dead_letter` decides whether to ask this),
and an operator's requeue and delete (the Redis work of a batch in one round trip, its event-log
rows in one COPY; `operations.deadletters` finds the letters and writes the audit lines)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from rig_conductor import logs
from rig_conductor.adapters import failures
from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.adapters.redis.streams import DeadLetter
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
    done = await redis_writes.dead_letter(
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
    await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=[row])
    await pg_writes.dead_lettered(
        journal.engine,
        tenant=journal.tenant,
        stream=stream,
        group=group,
        entries=[(item.entry_id, item.issue_id, item.deliveries)],
    )
    return item


def would_dead_letter(entry_id: EntryId, stream: StreamKey, deliveries: int) -> None:
    """A dry run's line for an entry it would dead-letter."""
    logger.info(
        "[StreamReclaim] DRY RUN: would dead-letter %s on %s after %d deliveries",
        entry_id,
        stream,
        deliveries,
    )


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


async def requeue(
    redis: AnyRedis, journal: Journal, *, stream: StreamKey, dlq_ids: Sequence[str], by: str
) -> dict[str, tuple[str, str | None]]:
    """One batch of letters back on their stream, each removed from the dead-letter stream in
    the same atomic script, and a DEAD_LETTER_REQUEUED row each: per letter requeued, the new
    entry's id and its issueId."""
    with failures.named_by_request():
        replies = await redis_writes.requeue_many(redis, stream=stream, dlq_ids=dlq_ids)
    done = {dlq_id: reply for dlq_id, reply in zip(dlq_ids, replies, strict=True) if reply}
    rows = [
        queries.EventRow(
            EventKind.DEAD_LETTER_REQUEUED,
            stream=stream,
            entry_id=entry_id,
            issue_id=issue_id,
            detail=json.dumps({"dlqId": dlq_id, "by": by}),
        )
        for dlq_id, (entry_id, issue_id) in done.items()
    ]
    await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=rows)
    return done


async def delete(
    redis: AnyRedis,
    journal: Journal,
    *,
    stream: StreamKey,
    letters: Sequence[DeadLetter],
    by: str,
) -> list[DeadLetter]:
    """One batch of letters deleted for good, and a DEAD_LETTER_DELETED row each that
    describes it; the letters there were to delete."""
    with failures.named_by_request():
        deleted = await redis_writes.delete_dead_letters(
            redis, stream=stream, dlq_ids=[letter.dlq_id for letter in letters]
        )
    gone = [letter for letter, ok in zip(letters, deleted, strict=True) if ok]
    rows = [
        queries.EventRow(
            EventKind.DEAD_LETTER_DELETED,
            consumer=letter.consumer or None,
            stream=stream,
            group_name=letter.group or None,
            entry_id=letter.original_id or None,
            issue_id=letter.fields.get("issueId"),
            detail=json.dumps({"dlqId": letter.dlq_id, "by": by, "reason": letter.reason}),
        )
        for letter in gone
    ]
    await pg_writes.append_events(journal.engine, tenant=journal.tenant, rows=rows)
    return gone
