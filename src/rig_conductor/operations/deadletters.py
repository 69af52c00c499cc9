"""Dead letters: find (filtered, paged), requeue and delete, one, the selected, or all that match.

Requeue appends the letter's original fields to its stream and removes the letter in one
atomic script; delete removes it. Both write an event-log row (through the request's write
port, `effects.dead_letters`) and an audit line with who.
Many letters go in batches of `BATCH`: the Redis work of a batch in one round trip, its
event-log rows in one COPY, its audit lines in one record; so ten thousand take seconds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rig_conductor import logs, roles
from rig_conductor.adapters import failures
from rig_conductor.adapters.redis import inspection as redis_inspect
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.streams import DeadLetter
from rig_conductor.domain import StreamKey
from rig_conductor.effects import port
from rig_conductor.runtime import Runtime

logger = logging.getLogger(logs.CONSOLE_LOGGER)

# What the console does to the dead letters it is given, and what it says it did.
Action = Literal["requeue", "delete"]
DONE: dict[Action, str] = {"requeue": "requeued", "delete": "deleted"}
# Dead letters read per round trip while filtering.
SCAN_PAGE = 500
# Dead letters requeued or deleted per round trip and per event-log COPY.
BATCH = 500
# The audit lines: from the console, and from the API (who, dead letter id, stream[, new id]).
REQUEUED = {
    True: "[Console] %s requeued dead letter %s of %s as %s",
    False: "Requeued dead letter %s of %s as %s (%s)",
}
DELETED = {
    True: "[Console] %s deleted dead letter %s of %s",
    False: "Deleted dead letter %s of %s (%s)",
}


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
    done = await _requeue(
        rt, _effects(rt), caller, stream=stream, dlq_ids=[dlq_id], console=console
    )
    return done.get(dlq_id)


async def delete(
    rt: Runtime, caller: roles.Caller, *, stream: StreamKey, dlq_id: str, console: bool = False
) -> bool:
    """Drop the letter for good; False when there is no such letter."""
    effects = _effects(rt)
    done = await _act(
        rt, effects, caller, "delete", stream=stream, dlq_ids=[dlq_id], console=console
    )
    return bool(done)


async def apply_to(
    rt: Runtime,
    caller: roles.Caller,
    action: Action,
    *,
    stream: StreamKey,
    dlq_ids: Sequence[str],
    console: bool = True,
) -> int:
    """Requeue (or delete) the dead letters with these ids (from the console, or the API);
    how many."""
    done = 0
    effects = _effects(rt)
    ids = list(dict.fromkeys(dlq_ids))
    for start in range(0, len(ids), BATCH):
        batch = ids[start : start + BATCH]
        done += await _act(
            rt, effects, caller, action, stream=stream, dlq_ids=batch, console=console
        )
    return done


async def apply_to_matching(
    rt: Runtime,
    caller: roles.Caller,
    action: Action,
    *,
    stream: StreamKey,
    where: Filter,
    console: bool = True,
) -> int:
    """Requeue (or delete) every dead letter that matches (from the console, or the API); how
    many."""
    done = 0
    effects = _effects(rt)
    cursor: str | None = None
    while True:
        page, cursor = await find(rt, stream=stream, where=where, before=cursor, count=BATCH)
        ids = [letter.dlq_id for letter in page]
        if ids:  # the page after a full last one comes back empty
            done += await _act(
                rt,
                effects,
                caller,
                action,
                stream=stream,
                dlq_ids=ids,
                letters=page,
                console=console,
            )
        if cursor is None:
            return done


def _effects(rt: Runtime) -> port.Effects:
    """The request's write port: an operator's change is never dry."""
    return port.choose(False, engine=rt.engine, tenant=rt.settings.tenant, metrics=rt.metrics)


async def _act(
    rt: Runtime,
    effects: port.Effects,
    caller: roles.Caller,
    action: Action,
    *,
    stream: StreamKey,
    dlq_ids: Sequence[str],
    letters: Sequence[DeadLetter] | None = None,
    console: bool,
) -> int:
    """One batch requeued or deleted; how many. `letters`: the letters of `dlq_ids`, when the
    caller has read them already (a delete's rows describe them)."""
    if action == "requeue":
        done = await _requeue(rt, effects, caller, stream=stream, dlq_ids=dlq_ids, console=console)
        return len(done)
    if letters is None:
        with failures.named_by_request():
            found = await redis_inspect.dead_letters_by_id(rt.redis, stream=stream, dlq_ids=dlq_ids)
        letters = list(found.values())
    return await _delete(rt, effects, caller, stream=stream, letters=letters, console=console)


async def _requeue(
    rt: Runtime,
    effects: port.Effects,
    caller: roles.Caller,
    *,
    stream: StreamKey,
    dlq_ids: Sequence[str],
    console: bool,
) -> dict[str, str]:
    """One batch: the letters back on the stream (one round trip), their rows (one COPY) and
    audit lines (one record); the new entry id of each letter requeued."""
    done = await effects.requeue(rt.redis, stream=stream, dlq_ids=dlq_ids, by=caller.who)
    lines = [
        REQUEUED[console] % _who_first(console, caller.who, dlq_id, stream, entry_id)
        for dlq_id, (entry_id, _) in done.items()
    ]
    _log(lines, caller, stream, list(done))
    return {dlq_id: entry_id for dlq_id, (entry_id, _) in done.items()}


async def _delete(
    rt: Runtime,
    effects: port.Effects,
    caller: roles.Caller,
    *,
    stream: StreamKey,
    letters: Sequence[DeadLetter],
    console: bool,
) -> int:
    """One batch: the letters deleted (one round trip), their rows (one COPY) and audit lines
    (one record); how many there were to delete."""
    gone = await effects.delete(rt.redis, stream=stream, letters=letters, by=caller.who)
    lines = [DELETED[console] % _who_first(console, caller.who, d.dlq_id, stream) for d in gone]
    _log(lines, caller, stream, [letter.dlq_id for letter in gone])
    return len(gone)


def _who_first(console: bool, who: str, *rest: str) -> tuple[str, ...]:
    """The console's lines name who first, the API's last."""
    return (who, *rest) if console else (*rest, who)


def _log(lines: list[str], caller: roles.Caller, stream: str, dlq_ids: list[str]) -> None:
    common = {"by": caller.who, "stream": stream}
    logs.log_lines(logger, logging.INFO, logs.Lines(lines, common, ("dlqId", dlq_ids)))
