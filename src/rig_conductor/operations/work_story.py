"""The story of one piece of work (`GET /api/work/{issueId}`, and of one entry): the event log's
timeline, a page at a time, beside where the entry stands now in each group of its stream.

An issue's story follows every entry it became: appended again after Redis lost its data
(ISSUE_ASSIGNED with `replaces`), requeued from its dead letters. Its current entry, the one
the document's `stream`, `entryId`, `state` and `groups` describe, is the newest of them. An
entry nobody dispatched through the API (a foreign one) is told with what Redis and the log
know of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rig_conductor.adapters import failures
from rig_conductor.adapters.postgres import story as rows
from rig_conductor.adapters.redis import holders as redis_holders
from rig_conductor.domain import EntryId, StreamKey
from rig_conductor.policy import story
from rig_conductor.runtime import Runtime

TIMELINE_PAGE = 100
MAX_PAGE = 1_000


@dataclass(frozen=True, slots=True)
class Story:
    issue_id: str | None
    stream: str
    entry_id: str
    state: story.State
    groups: list[story.GroupStory]
    timeline: list[dict[str, Any]]
    # The cursor of the timeline's next page (`after`); None when this page is the last.
    next_after: int | None = None
    entries: list[rows.EntryRef] = field(default_factory=list)
    # What knows the current entry besides the event log: Redis still has it, or it has an
    # assignment row.
    known: bool = False


async def of_issue(rt: Runtime, issue_id: str, *, after: int, limit: int) -> Story | None:
    """None for an issue never dispatched (and never named by an agent's report)."""
    if not _storable(issue_id):
        return None  # no such issue could have been stored
    tenant = rt.settings.tenant
    entries = await rows.issue_entries(rt.engine, tenant=tenant, issue_id=issue_id)
    if not entries:
        return None
    return await _told(rt, issue_id, entries, after=after, limit=limit)


async def of_entry(
    rt: Runtime, stream: StreamKey, entry_id: EntryId, *, after: int, limit: int
) -> Story | None:
    """None when neither the log nor Redis knows the entry."""
    entry = rows.EntryRef(stream, entry_id)
    issue_id = await rows.entry_issue(rt.engine, tenant=rt.settings.tenant, entry=entry)
    told = await _told(rt, issue_id, [entry], after=after, limit=limit)
    if issue_id is None and not told.timeline and after == 0 and not told.known:
        return None
    return told


def _assignment(row: rows.AssignmentRow | None) -> story.Assignment | None:
    return None if row is None else story.Assignment(row.state, row.consumer, row.attempt)


def _storable(text: str) -> bool:
    """Text PostgreSQL can hold (no NUL, no lone surrogate): anything else names nothing."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


async def _told(
    rt: Runtime,
    issue_id: str | None,
    entries: list[rows.EntryRef],
    *,
    after: int,
    limit: int,
) -> Story:
    tenant = rt.settings.tenant
    current = entries[-1]
    with failures.named_by_request():
        seen = await redis_holders.look(
            rt.redis, stream=StreamKey(current.stream), entry_id=EntryId(current.entry_id)
        )
    # Work is owned per group: each group's state comes from its own attempts (a row from
    # before groups were recorded stands for whichever group has no row of its own).
    by_group = await rows.assignment_rows(rt.engine, tenant=tenant, entry=current)
    row = by_group.get(None) or next(iter(by_group.values()), None)
    assignment = _assignment(row)
    dead_in = await rows.dead_lettered_groups(rt.engine, tenant=tenant, entry=current)
    groups = [
        story.group_state(
            story.GroupLook(
                hold.group,
                delivered=story.entry_key(hold.last_delivered_id)
                >= story.entry_key(current.entry_id),
                holder=hold.holder,
            ),
            _assignment(by_group.get(hold.group) or by_group.get(None)),
            dead_lettered=hold.group in dead_in,
        )
        for hold in seen.groups
    ]
    if seen.fields is None and not any(g.holder for g in groups):
        groups = []  # Redis no longer has the entry: the groups' marks say nothing of it
    found = await rows.timeline(rt.engine, tenant=tenant, entries=entries, after=after, limit=limit)
    if issue_id is None:
        issue_id = (seen.fields or {}).get("issueId") or (row.issue_id if row else None)
    return Story(
        issue_id=issue_id,
        stream=current.stream,
        entry_id=current.entry_id,
        state=story.summary(groups, assignment),
        groups=groups,
        timeline=[story.item(r) for r in found],
        next_after=found[-1].last_id if len(found) == limit else None,
        entries=entries,
        known=seen.fields is not None or row is not None,
    )
