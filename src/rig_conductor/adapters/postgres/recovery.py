"""After Redis lost its data: which dispatches are unfinished, fencing off a lost entry in every
group that read it, and the record of appending a dispatch again, with what each group had
finished carried over to the new entry. Decides nothing: `reaper.redis_loss` does.

Work is owned per group, so a dispatch is unfinished when any group that reads its stream has
not finished it: its first group (`assignments`), a group with a row of its own
(`group_assignments`), or a group that read the stream's entries since before this dispatch and
never reported on this one (it had not read it yet: a lagging group's backlog is lost with
Redis too). The new entry is one stream entry for every group, so each group that had finished
the old one gets a done row on the new one: its holder is answered "done" and acks, publishing
first what was accepted and not published yet. A group that has not finished it runs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.dispatches import RecentDispatch, assigned
from rig_conductor.adapters.postgres.tables import (
    assignments,
    dispatches,
    events,
    group_assignments,
)
from rig_conductor.domain import AssignmentState, EventKind


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A dispatch some group has not finished. One recorded before migration 0006 kept the
    fields has none (`appendable` False): it cannot be appended again."""

    dispatch: RecentDispatch
    created_at: datetime
    appendable: bool


# A row that finished its group's work: dead-lettered, or done with nothing left to publish.
_FINISHED = (
    "({a}.state = 'dead' OR ({a}.state = 'done' "
    "AND ({a}.outputs IS NULL OR {a}.published_at IS NOT NULL)))"
)
_FIRST_FINISHED = _FINISHED.format(a="a")
_OTHER_FINISHED = _FINISHED.format(a="g")

# The groups that read a stream, each with the oldest dispatch it reported on: a dispatch made
# since then was theirs to read. A first-lane row of no group (written before groups were
# recorded) names none.
_GROUPS_SINCE = text(
    """
    SELECT x.group_name, min(d.created_at)
      FROM (SELECT entry_id, group_name FROM assignments
             WHERE tenant = :tenant AND stream = :stream AND group_name IS NOT NULL
            UNION ALL
            SELECT entry_id, group_name FROM group_assignments
             WHERE tenant = :tenant AND stream = :stream) AS x
      JOIN dispatches d ON d.tenant = :tenant AND d.stream = :stream AND d.entry_id = x.entry_id
     GROUP BY x.group_name
    """
)

# The dispatches of one stream within the window that some group has not finished (above), in
# keyset pages: (created_at, key) never changes when a row follows a new entry, so a page
# boundary holds while the rows are rewritten. A first-lane row of no group counts for every
# group, as the lanes take it (`lanes.FIRST`).
_UNFINISHED = text(
    f"""
    SELECT d.idempotency_key, d.entry_id, d.issue_id, d.agent_id, d.fields, d.created_at
      FROM dispatches d
     WHERE d.tenant = :tenant AND d.stream = :stream
       AND d.created_at > now() - make_interval(secs => :window_s)
       AND (NOT EXISTS (SELECT 1 FROM assignments a
                         WHERE a.tenant = d.tenant AND a.stream = d.stream
                           AND a.entry_id = d.entry_id AND {_FIRST_FINISHED})
            OR EXISTS (SELECT 1 FROM group_assignments g
                        WHERE g.tenant = d.tenant AND g.stream = d.stream
                          AND g.entry_id = d.entry_id AND NOT {_OTHER_FINISHED})
            OR EXISTS (
                SELECT 1 FROM unnest(CAST(:groups AS text[]), CAST(:since AS timestamptz[]))
                           AS k(name, since)
                 WHERE d.created_at >= k.since
                   AND NOT EXISTS (SELECT 1 FROM assignments a
                                    WHERE a.tenant = d.tenant AND a.stream = d.stream
                                      AND a.entry_id = d.entry_id
                                      AND (a.group_name IS NULL OR a.group_name = k.name)
                                      AND {_FIRST_FINISHED})
                   AND NOT EXISTS (SELECT 1 FROM group_assignments g
                                    WHERE g.tenant = d.tenant AND g.stream = d.stream
                                      AND g.entry_id = d.entry_id AND g.group_name = k.name
                                      AND {_OTHER_FINISHED})))
       AND (CAST(:after_at AS timestamptz) IS NULL
            OR (d.created_at, d.idempotency_key) > (CAST(:after_at AS timestamptz), :after_key))
     ORDER BY d.created_at, d.idempotency_key
     LIMIT :limit
    """
)


async def groups_since(engine: AsyncEngine, *, tenant: str, stream: str) -> dict[str, datetime]:
    """group -> the oldest dispatch of `stream` it reported on."""
    async with engine.connect() as conn:
        rows = await conn.execute(_GROUPS_SINCE, {"tenant": tenant, "stream": stream})
        return {group: since for group, since in rows}


async def unfinished(
    engine: AsyncEngine,
    *,
    tenant: str,
    stream: str,
    window_s: float,
    groups: dict[str, datetime],
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Unfinished]:
    """One page of the stream's unfinished dispatches, oldest first, after `after` (the last
    page's (created_at, key)); `groups` as `groups_since` gives them."""
    params = {
        "tenant": tenant,
        "stream": stream,
        "window_s": window_s,
        "groups": list(groups),
        "since": list(groups.values()),
        "after_at": after[0] if after else None,
        "after_key": after[1] if after else "",
        "limit": limit,
    }
    async with engine.connect() as conn:
        rows = await conn.execute(_UNFINISHED, params)
        return [
            Unfinished(
                RecentDispatch(
                    key,
                    stream,
                    entry_id,
                    issue_id,
                    agent_id,
                    dict(fields) if isinstance(fields, dict) else {},
                ),
                created_at,
                isinstance(fields, dict),
            )
            for key, entry_id, issue_id, agent_id, fields, created_at in rows
        ]


def expected_groups(groups: dict[str, datetime], item: Unfinished) -> list[str]:
    """The groups whose work `item` was: those reading its stream since before it."""
    return sorted(group for group, since in groups.items() if item.created_at >= since)


@dataclass(frozen=True, slots=True)
class Carry:
    """What one group had finished of a lost entry, taken over by the new entry: done at that
    attempt. `outputs`: accepted and not published yet (the new entry's holder publishes them);
    None when there was nothing left to publish. `first`: the group held the entry's first lane."""

    attempt: int
    consumer: str | None
    outputs: list[dict[str, str]] | None
    group: str | None = None
    first: bool = True


@dataclass(frozen=True, slots=True)
class Fence:
    """A lost entry fenced off: who was on it in its first lane before (None: nobody had
    reported on it), and what each group had finished, carried over to the new entry."""

    state: str | None
    consumer: str | None
    carries: tuple[Carry, ...] = ()

    @property
    def carry(self) -> Carry | None:
        """The accepted completion still to publish, if any group has one (the first's first)."""
        return next((c for c in self.carries if c.outputs), None)


# Fence a lost entry off for good: state `superseded` with its attempt moved on, so every
# report of an attempt on it (a holder that had it in hand when Redis lost it) is fenced, and
# no start takes it again. An entry nobody reported on gets the row, so a start that raced
# with the loss is fenced too. A dead entry, and a done one whose outputs are published (or
# had none), are left as they are. A done one whose outputs are not published is superseded at
# the same attempt, keeping its outputs: the new entry carries them over.
_SUPERSEDE = text(
    """
    WITH prior AS (
        SELECT state, consumer FROM assignments
         WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
    ), fenced AS (
        INSERT INTO assignments AS a (tenant, stream, entry_id, issue_id, state, attempt)
        VALUES (:tenant, :stream, :entry_id, :issue_id, 'superseded', 1)
        ON CONFLICT (tenant, stream, entry_id) DO UPDATE
           SET state = 'superseded', updated_at = now(),
               attempt = CASE WHEN a.state = 'done' THEN a.attempt ELSE a.attempt + 1 END
         WHERE a.state NOT IN ('done', 'dead', 'superseded')
            OR (a.state = 'done' AND a.outputs IS NOT NULL AND a.published_at IS NULL)
        RETURNING attempt
    )
    SELECT (SELECT state FROM prior), (SELECT consumer FROM prior),
           EXISTS (SELECT 1 FROM fenced)
    """
)

# The lost entry's attempts in the other groups that read it are fenced off alike.
_SUPERSEDE_OTHER_GROUPS = text(
    """
    UPDATE group_assignments AS a
       SET state = 'superseded', updated_at = now(),
           attempt = CASE WHEN a.state = 'done' THEN a.attempt ELSE a.attempt + 1 END
     WHERE a.tenant = :tenant AND a.stream = :stream AND a.entry_id = :entry_id
       AND (a.state NOT IN ('done', 'dead', 'superseded')
            OR (a.state = 'done' AND a.outputs IS NOT NULL AND a.published_at IS NULL))
    """
)

# Every group's row of the entry as it is now, the first lane's first.
_ROWS = text(
    """
    SELECT true AS first, group_name, state, attempt, consumer, outputs, published_at
      FROM assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
    UNION ALL
    SELECT false, group_name, state, attempt, consumer, outputs, published_at
      FROM group_assignments
     WHERE tenant = :tenant AND stream = :stream AND entry_id = :entry_id
     ORDER BY 1 DESC, 2
    """
)


async def supersede(
    engine: AsyncEngine,
    *,
    tenant: str,
    dispatch: RecentDispatch,
    expected: Sequence[str] = (),
) -> Fence | None:
    """Fence the dispatch's recorded entry off, in every group, before it is appended again.
    None when every group finished it meanwhile (a holder completed it and published its
    outputs): then it must not be appended. `expected`: the groups whose work it was
    (`expected_groups`); one without a row has not finished it."""
    params = {
        "tenant": tenant,
        "stream": dispatch.stream,
        "entry_id": dispatch.entry_id,
        "issue_id": dispatch.issue_id,
    }
    async with engine.begin() as conn:
        state, consumer, _ = (await conn.execute(_SUPERSEDE, params)).one()
        await conn.execute(_SUPERSEDE_OTHER_GROUPS, params)
        # The rows as they are now decide, not the statements' snapshot: superseded already (a
        # conductor that died before appending), or finished.
        rows = (await conn.execute(_ROWS, params)).all()
    carries = tuple(_carry_of(row) for row in rows if _carried(row))
    owned = {row.group_name for row in rows if row.state != AssignmentState.SUPERSEDED}
    unfinished = any(row.state == AssignmentState.SUPERSEDED for row in rows) or any(
        group not in owned and None not in owned for group in expected
    )
    if not unfinished:
        return None
    return Fence(state, consumer, carries)


def _carried(row: Any) -> bool:
    """Finished in its group: done and published (or nothing to publish), or superseded at an
    accepted completion whose outputs are still to publish. A dead one runs again."""
    if row.state == AssignmentState.DONE:
        return True
    superseded = row.state == AssignmentState.SUPERSEDED
    return superseded and bool(row.outputs) and row.published_at is None


def _carry_of(row: Any) -> Carry:
    outputs = row.outputs if row.state == AssignmentState.SUPERSEDED else None
    return Carry(row.attempt, row.consumer, outputs, row.group_name, row.first)


# The lock a recovery's append holds until the new entry's rows are written, and the first start
# of an entry waits on (shared): keyed by tenant, stream and issue, as the agent reports them.
_APPEND_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))")
_WAIT_FOR_APPEND = text("SELECT pg_advisory_xact_lock_shared(hashtextextended(:key, 0))")


def _lock_key(tenant: str, stream: str, issue_id: str) -> str:
    return f"{tenant}\x1f{stream}\x1f{issue_id}"


@contextlib.asynccontextmanager
async def appending(
    engine: AsyncEngine, *, tenant: str, dispatch: RecentDispatch
) -> AsyncIterator[AsyncConnection]:
    """A transaction to append the dispatch again in, and to record its new entry
    (`reappended`): an agent that reads the new entry and starts it at once waits
    (`wait_for_append`) until the rows that carry each group's finished work are written, so it
    is answered "done" rather than given a new attempt."""
    async with engine.begin() as conn:
        key = _lock_key(tenant, dispatch.stream, dispatch.issue_id)
        await conn.execute(_APPEND_LOCK, {"key": key})
        yield conn


async def wait_for_append(
    conn: AsyncConnection, *, tenant: str, stream: str, issue_id: str | None
) -> None:
    """Wait, in a WORK_STARTED's transaction, for a recovery appending this issue's dispatch
    again to have written the new entry's rows (`appending`)."""
    if issue_id is not None:
        await conn.execute(_WAIT_FOR_APPEND, {"key": _lock_key(tenant, stream, issue_id)})


async def reappended(
    conn: AsyncConnection,
    *,
    tenant: str,
    dispatch: RecentDispatch,
    entry_id: str,
    carries: Sequence[Carry] = (),
) -> bool:
    """The dispatch now lives at `entry_id`: the row follows, and the event log says why (the
    audit counts the old entry as replaced, not lost). False when the row had followed
    already (another conductor got there first): then nothing is written.

    Each of `carries` becomes the new entry's row in its group, in the same transaction: done
    at that attempt, with the outputs still to publish, and a WORK_COMPLETED row that says
    where it came from. Its holder in that group is answered "done" (with the outputs to
    publish), and acks."""
    moved = await conn.execute(
        dispatches.update()
        .where(
            dispatches.c.tenant == tenant,
            dispatches.c.idempotency_key == dispatch.key,
            dispatches.c.entry_id == dispatch.entry_id,
        )
        .values(entry_id=entry_id)
        .returning(dispatches.c.entry_id)
    )
    if moved.first() is None:
        return False
    await assigned(
        conn,
        tenant,
        dispatch.agent_id,
        dispatch.stream,
        entry_id,
        dispatch.issue_id,
        {"idempotencyKey": dispatch.key, "replaces": dispatch.entry_id},
    )
    for carry in carries:
        await _carry(conn, tenant, dispatch, entry_id, carry)
    return True


async def _carry(
    conn: AsyncConnection, tenant: str, dispatch: RecentDispatch, entry_id: str, carry: Carry
) -> None:
    row: dict[str, Any] = {
        "tenant": tenant,
        "stream": dispatch.stream,
        "entry_id": entry_id,
        "issue_id": dispatch.issue_id,
        "state": AssignmentState.DONE,
        "consumer": carry.consumer,
        "attempt": carry.attempt,
        "outputs": carry.outputs,
        "group_name": carry.group,
    }
    if carry.outputs is None:
        row["published_at"] = func.now()
    if carry.first or carry.group is None:
        await conn.execute(insert(assignments).values(**row).on_conflict_do_nothing())
    else:
        await conn.execute(insert(group_assignments).values(**row).on_conflict_do_nothing())
    await conn.execute(
        events.insert().values(
            tenant=tenant,
            kind=EventKind.WORK_COMPLETED,
            consumer=carry.consumer,
            stream=dispatch.stream,
            group_name=carry.group,
            entry_id=entry_id,
            issue_id=dispatch.issue_id,
            attempt=carry.attempt,
            detail={"carriedFrom": dispatch.entry_id, "outputs": len(carry.outputs or ())},
        )
    )
