"""Dead letters: find (filtered, paged), requeue and delete, one at a time or all that match.

Requeue appends the letter's original fields to its stream and removes the letter in one
atomic script; delete removes it. Both write an event-log row and an audit line with who.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from rig_conductor import roles
from rig_conductor.adapters import failures, redis_inspect, redis_streams
from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.redis_streams import DeadLetter
from rig_conductor.domain import StreamKey
from rig_conductor.runtime import Runtime

logger = logging.getLogger("rig_conductor.console")

# Dead letters read per round trip while filtering.
SCAN_PAGE = 500


@dataclass(frozen=True, slots=True)
class Filter:
    """`text` matches any field value, the original id or the consumer; `reason` exactly."""

    text: str = ""
    reason: str = ""

    def matches(self, letter: DeadLetter) -> bool:
        if self.reason and letter.reason != self.reason:
            return False
        if not self.text:
            return True
        needle = self.text.lower()
        haystack = (letter.original_id, letter.consumer, letter.group, *letter.fields.values())
        return any(needle in value.lower() for value in haystack)


async def find(
    rt: Runtime, *, stream: StreamKey, where: Filter, before: str | None, count: int
) -> tuple[list[DeadLetter], str | None]:
    """Up to `count` matching dead letters older than `before`, newest first, and the cursor
    of the next page (None at the end)."""
    found: list[DeadLetter] = []
    cursor = before
    while len(found) < count:
        with failures.named_by_request():
            page, next_cursor = await redis_inspect.dead_letter_page(
                rt.redis, stream=stream, before=cursor, count=SCAN_PAGE
            )
        for letter in page:
            if where.matches(letter):
                found.append(letter)
                if len(found) == count:
                    return found, letter.dlq_id
        if next_cursor is None:
            return found, None
        cursor = next_cursor
    return found, cursor


async def newest(rt: Runtime, *, stream: StreamKey, count: int) -> list[DeadLetter]:
    """The newest `count` dead letters of `stream`, newest first."""
    with failures.named_by_request():
        return await redis_streams.list_dead_letters(rt.redis, stream=stream, count=count)


async def requeue(
    rt: Runtime, caller: roles.Caller, *, stream: StreamKey, dlq_id: str, console: bool = False
) -> str | None:
    """Put the letter back on its stream; the new entry's id, None when there is no letter."""
    with failures.named_by_request():
        done = await redis_streams.requeue(rt.redis, stream=stream, dlq_id=dlq_id)
    if done is None:
        return None
    entry_id, issue_id = done
    await queries.append_events(
        rt.engine,
        tenant=rt.settings.tenant,
        rows=[
            queries.EventRow(
                "DEAD_LETTER_REQUEUED",
                stream=stream,
                entry_id=entry_id,
                issue_id=issue_id,
                detail=json.dumps({"dlqId": dlq_id, "by": caller.who}),
            )
        ],
    )
    if console:
        logger.info(
            "[Console] %s requeued dead letter %s of %s as %s", caller.who, dlq_id, stream, entry_id
        )
    else:
        logger.info(
            "Requeued dead letter %s of %s as %s (%s)", dlq_id, stream, entry_id, caller.who
        )
    return entry_id


async def delete(
    rt: Runtime, caller: roles.Caller, *, stream: StreamKey, dlq_id: str, console: bool = False
) -> bool:
    """Drop the letter for good; False when there is no such letter."""
    with failures.named_by_request():
        letters = await redis_streams.list_dead_letters(
            rt.redis, stream=stream, count=1, before=dlq_id
        )
        letter = letters[0] if letters and letters[0].dlq_id == dlq_id else None
        if letter is None or not await redis_inspect.delete_dead_letter(
            rt.redis, stream=stream, dlq_id=dlq_id
        ):
            return False
    await queries.append_events(
        rt.engine,
        tenant=rt.settings.tenant,
        rows=[
            queries.EventRow(
                "DEAD_LETTER_DELETED",
                consumer=letter.consumer or None,
                stream=stream,
                group_name=letter.group or None,
                entry_id=letter.original_id or None,
                issue_id=letter.fields.get("issueId"),
                detail=json.dumps({"dlqId": dlq_id, "by": caller.who, "reason": letter.reason}),
            )
        ],
    )
    if console:
        logger.info("[Console] %s deleted dead letter %s of %s", caller.who, dlq_id, stream)
    else:
        logger.info("Deleted dead letter %s of %s (%s)", dlq_id, stream, caller.who)
    return True


async def apply_to_matching(
    rt: Runtime,
    caller: roles.Caller,
    *,
    stream: StreamKey,
    where: Filter,
    requeueing: bool,
) -> int:
    """Requeue (or delete) every dead letter that matches; how many."""
    done = 0
    cursor: str | None = None
    while True:
        page, cursor = await find(rt, stream=stream, where=where, before=cursor, count=SCAN_PAGE)
        for letter in page:
            if requeueing:
                entry = await requeue(rt, caller, stream=stream, dlq_id=letter.dlq_id, console=True)
                done += entry is not None
            else:
                done += await delete(rt, caller, stream=stream, dlq_id=letter.dlq_id, console=True)
        if cursor is None:
            return done
