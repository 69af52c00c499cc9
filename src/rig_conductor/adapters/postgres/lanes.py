"""Where a group's attempts of a stream entry live: the statements of `work`, per lane.

Work is owned per group. `assignments` holds one row per entry, claimed by the first group
that works on it (`group_name`; NULL for rows written before groups were recorded, claimed by
the first group that reports on them); the entry's attempts in every other group live in
`group_assignments`. The previous release reads and writes `assignments` alone, by (tenant,
stream, entry_id), so during a rolling upgrade both releases share the first group's rows.

A report that names no group (an agent of the previous release whose group could not be told)
takes the first lane whatever group holds it, as the previous release would.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from rig_conductor.domain import CLOSED_STATES, AssignmentState, EventKind

# A work report's kind, or the name of one of the other statements below.
Kind = str


@dataclass(frozen=True, slots=True)
class Lane:
    table: str
    # The conflict target of an insert, and the condition that finds the row (alias `a`).
    key: str
    match: str
    grouped: bool  # `group_name` is part of the key

    def statement(self, kind: Kind) -> Any:
        return _statement(self, kind)


FIRST = Lane(
    "assignments",
    "tenant, stream, entry_id",
    "a.tenant = :tenant AND a.stream = :stream AND a.entry_id = :entry_id "
    "AND (CAST(:group AS text) IS NULL OR a.group_name IS NULL OR a.group_name = :group)",
    grouped=False,
)
OTHER = Lane(
    "group_assignments",
    "tenant, stream, group_name, entry_id",
    "a.tenant = :tenant AND a.stream = :stream AND a.group_name = :group "
    "AND a.entry_id = :entry_id",
    grouped=True,
)

_RETURNING = "RETURNING attempt, state, outputs, published_at"

_TEMPLATES: dict[Kind, str] = {
    # A reclaim reserved attempt n for its target (state 'pending'): the target's start takes it
    # rather than skipping a number; any other start opens the next attempt.
    EventKind.WORK_STARTED: """
    INSERT INTO {table} AS a (tenant, stream, entry_id, group_name, issue_id, state, consumer,
                              attempt, progress_at)
    VALUES (:tenant, :stream, :entry_id, :group, :issue_id, {RUNNING}, :consumer, 1, now())
    ON CONFLICT ({key}) DO UPDATE
       SET attempt = CASE WHEN a.state = {PENDING} AND a.consumer = EXCLUDED.consumer
                          THEN a.attempt ELSE a.attempt + 1 END,
           state = {RUNNING}, consumer = EXCLUDED.consumer,
           issue_id = COALESCE(a.issue_id, EXCLUDED.issue_id), updated_at = now(),
           progress_at = now(), group_name = COALESCE(a.group_name, EXCLUDED.group_name)
     WHERE a.state NOT IN {CLOSED}
       AND (CAST(:claimed AS integer) IS NULL OR CAST(:claimed AS integer) >= a.attempt)
       AND (EXCLUDED.group_name IS NULL OR a.group_name IS NULL
            OR a.group_name = EXCLUDED.group_name)
    {returning}
    """,
    # Finishing and progress apply only to the attempt named, and only from the consumer that
    # owns it: the one whose start (or the reclaim to it) made that attempt.
    EventKind.WORK_FAILED: """
    UPDATE {table} AS a
       SET state = {FAILED}, issue_id = COALESCE(a.issue_id, :issue_id), updated_at = now()
     WHERE {match} AND a.attempt = :claimed AND a.consumer = :consumer
       AND a.state NOT IN {CLOSED}
    {returning}
    """,
    # A completion records its staged outputs in the transaction that marks the entry done: the
    # durable record of what still has to be published. None staged: nothing to publish. A
    # retry of an accepted completion (its answer was lost) changes nothing.
    EventKind.WORK_COMPLETED: """
    UPDATE {table} AS a
       SET state = {DONE}, issue_id = COALESCE(a.issue_id, :issue_id), updated_at = now(),
           outputs = CASE WHEN a.state = {DONE} THEN a.outputs ELSE CAST(:outputs AS jsonb) END,
           published_at = CASE WHEN a.state = {DONE} THEN a.published_at
                               WHEN CAST(:outputs AS jsonb) IS NULL THEN now() END
     WHERE {match} AND a.attempt = :claimed AND a.consumer = :consumer
       AND a.state NOT IN ({DEAD}, {SUPERSEDED})
    {returning}
    """,
    # The accepted attempt's outputs were renamed onto their paths: by its owner, or by a
    # consumer that holds the entry now (the owner died before renaming). Repeats change nothing.
    EventKind.WORK_PUBLISHED: """
    UPDATE {table} AS a
       SET published_at = COALESCE(a.published_at, now()), updated_at = now()
     WHERE {match} AND a.attempt = :claimed AND a.state = {DONE}
       AND (a.consumer = :consumer OR :held)
    {returning}
    """,
    # The accepted attempt's outputs are found nowhere (staged on a disk that went with its pod):
    # the completion cannot be published, so it does not count. The next attempt is reserved for
    # the consumer that found them missing (it holds the entry) and the accepted one is fenced.
    "UNPUBLISHABLE": """
    UPDATE {table} AS a
       SET state = {PENDING}, attempt = a.attempt + 1, consumer = :consumer, outputs = NULL,
           published_at = NULL, updated_at = now(), progress_at = now()
     WHERE {match} AND a.attempt = :claimed AND a.state = {DONE} AND a.published_at IS NULL
       AND a.outputs IS NOT NULL AND (a.consumer = :consumer OR :held)
    {returning}
    """,
    # Progress restarts the current attempt's deadline (rule 4b, docs/rules.md); nothing else.
    EventKind.WORK_PROGRESS: """
    UPDATE {table} AS a SET progress_at = now(), updated_at = now()
     WHERE {match} AND a.attempt = :claimed AND a.consumer = :consumer
       AND a.state NOT IN {CLOSED}
    {returning}
    """,
    "CURRENT": """
    SELECT a.attempt, a.state, a.consumer, a.outputs, a.published_at FROM {table} AS a
     WHERE {match}
    """,
    "DONE": """
    SELECT a.attempt, a.state, a.outputs, a.published_at FROM {table} AS a
     WHERE {match} AND a.state = {DONE}
    """,
}


# The states as SQL literals, for the templates: `{DONE}` is 'done', `{CLOSED}` the closed ones.
_STATES = {state.name: f"'{state}'" for state in AssignmentState}
_STATES["CLOSED"] = f"({', '.join(_STATES[state.name] for state in CLOSED_STATES)})"


@cache
def _statement(lane: Lane, kind: Kind) -> Any:
    return text(
        _TEMPLATES[kind].format(
            table=lane.table, key=lane.key, match=lane.match, returning=_RETURNING, **_STATES
        )
    )


# The group that claimed an entry's first lane, if anyone has: locked, so the lane stays put
# while a report is applied.
_CLAIMED = text(
    """
    SELECT group_name FROM assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
       FOR UPDATE
    """
)


# A row of this group in the other lane with nobody in the first: an entry appended again after
# Redis lost its data, carrying this group's done state over (`recovery_writes.reappended`).
_OTHER_ROW = text(
    """
    SELECT 1 FROM group_assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id AND group_name = :group
    """
)


async def lane_of(conn: AsyncConnection, params: dict[str, Any]) -> Lane:
    """The lane of `params`' (tenant, stream, group, entry_id): the first one when no group is
    named, nobody claimed it yet, or this group (or a report from before groups) did; the other
    one when another group did, or when this group's row was written there already."""
    if params.get("group") is None:
        return FIRST
    row = (await conn.execute(_CLAIMED, params)).first()
    if row is None:
        return OTHER if (await conn.execute(_OTHER_ROW, params)).first() else FIRST
    if row.group_name is None or row.group_name == params["group"]:
        return FIRST
    return OTHER
