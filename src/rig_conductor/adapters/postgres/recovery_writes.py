"""The writes of a recovery after Redis lost its data: a lost entry fenced off in every group
that read it, and the record of appending its dispatch again, with what each group had
finished carried over to the new entry. Only the write port (`effects.redis_loss`,
`effects.redispatch`) imports it (pyproject.toml); which dispatches are unfinished is read in
`recovery`. Decides nothing: `reaper.redis_loss` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.dispatches import RecentDispatch, assigned
from rig_conductor.adapters.postgres.recovery import lock_key
from rig_conductor.adapters.postgres.tables import (
    assignments,
    dispatches,
    events,
    group_assignments,
)
from rig_conductor.domain import AssignmentState, EventKind


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


@contextlib.asynccontextmanager
async def appending(
    engine: AsyncEngine, *, tenant: str, dispatch: RecentDispatch
) -> AsyncIterator[AsyncConnection]:
    """A transaction to append the dispatch again in, and to record its new entry
    (`reappended`): an agent that reads the new entry and starts it at once waits
    (`wait_for_append`) until the rows that carry each group's finished work are written, so it
    is answered "done" rather than given a new attempt."""
    async with engine.begin() as conn:
        key = lock_key(tenant, dispatch.stream, dispatch.issue_id)
        await conn.execute(_APPEND_LOCK, {"key": key})
        yield conn


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
