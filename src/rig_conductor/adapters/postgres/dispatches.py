"""Dispatches Redis may have lost: recent ones no agent has reported on, every unfinished one
after Redis lost its data, the epochs that tell such a loss, fencing off a lost entry, and the
record of appending a dispatch again. Decides nothing: `reaper.redispatch` and
`reaper.redis_loss` do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, dispatches, events, redis_epochs


@dataclass(frozen=True, slots=True)
class RecentDispatch:
    key: str
    stream: str
    entry_id: str
    issue_id: str
    agent_id: str
    fields: dict[str, str]


# Dispatches recorded within the window, with their fields, that no agent has reported on yet
# (no assignment row): those are the ones a lost append could have dropped unseen.
_RECENT_UNSTARTED = text(
    """
    SELECT d.idempotency_key, d.stream, d.entry_id, d.issue_id, d.agent_id, d.fields
      FROM dispatches d
      LEFT JOIN assignments a
        ON a.tenant = d.tenant AND a.stream = d.stream AND a.entry_id = d.entry_id
     WHERE d.tenant = :tenant AND jsonb_typeof(d.fields) = 'object'
       AND d.created_at > now() - make_interval(secs => :window_s)
       AND a.entry_id IS NULL
     ORDER BY d.created_at
     LIMIT :limit
    """
)


async def record_dispatch(
    engine: AsyncEngine,
    *,
    tenant: str,
    key: str,
    issue_id: str,
    agent_id: str,
    stream: str,
    entry_id: str,
    fields: Mapping[str, str] | None = None,
) -> bool:
    """Record an appended dispatch once per idempotency key, with the `fields` appended; True
    when recorded now.

    Called after every append and every repeat: a repeat whose first attempt appended but could
    not record (PostgreSQL down, or the process killed in between) completes the record, and
    the ISSUE_ASSIGNED event is written exactly once, with the row.
    """
    async with engine.begin() as conn:
        inserted = await conn.execute(
            insert(dispatches)
            .values(
                tenant=tenant,
                idempotency_key=key,
                stream=stream,
                entry_id=entry_id,
                issue_id=issue_id,
                agent_id=agent_id,
                fields=dict(fields) if fields is not None else None,
            )
            .on_conflict_do_nothing()
            .returning(dispatches.c.idempotency_key)
        )
        if inserted.first() is None:
            return False
        await _assigned(conn, tenant, agent_id, stream, entry_id, issue_id, {"idempotencyKey": key})
    return True


async def recent_unstarted(
    engine: AsyncEngine, *, tenant: str, window_s: float, limit: int
) -> list[RecentDispatch]:
    params = {"tenant": tenant, "window_s": window_s, "limit": limit}
    async with engine.connect() as conn:
        rows = await conn.execute(_RECENT_UNSTARTED, params)
        return [
            RecentDispatch(key, stream, entry_id, issue_id, agent_id, dict(fields))
            for key, stream, entry_id, issue_id, agent_id, fields in rows
        ]


async def reappended(
    engine: AsyncEngine,
    *,
    tenant: str,
    dispatch: RecentDispatch,
    entry_id: str,
    carry: Carry | None = None,
) -> bool:
    """The dispatch now lives at `entry_id`: the row follows, and the event log says why (the
    audit counts the old entry as replaced, not lost). False when the row had followed
    already (another conductor got there first): then nothing is written.

    With `carry`, the new entry takes over the accepted completion whose outputs are still to
    publish, in the same transaction: done at that attempt, with those outputs, and a
    WORK_COMPLETED row that says where it came from. Its holder is answered "done" with the
    outputs, publishes them and acks."""
    async with engine.begin() as conn:
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
        await _assigned(
            conn,
            tenant,
            dispatch.agent_id,
            dispatch.stream,
            entry_id,
            dispatch.issue_id,
            {"idempotencyKey": dispatch.key, "replaces": dispatch.entry_id},
        )
        if carry is not None:
            await _carry(conn, tenant, dispatch, entry_id, carry)
    return True


async def _carry(
    conn: AsyncConnection, tenant: str, dispatch: RecentDispatch, entry_id: str, carry: Carry
) -> None:
    await conn.execute(
        insert(assignments)
        .values(
            tenant=tenant,
            stream=dispatch.stream,
            entry_id=entry_id,
            issue_id=dispatch.issue_id,
            state="done",
            consumer=carry.consumer,
            attempt=carry.attempt,
            outputs=carry.outputs,
            group_name=carry.group,
        )
        .on_conflict_do_nothing()
    )
    await conn.execute(
        events.insert().values(
            tenant=tenant,
            kind="WORK_COMPLETED",
            consumer=carry.consumer,
            stream=dispatch.stream,
            group_name=carry.group,
            entry_id=entry_id,
            issue_id=dispatch.issue_id,
            attempt=carry.attempt,
            detail={"carriedFrom": dispatch.entry_id, "outputs": len(carry.outputs)},
        )
    )


async def _assigned(
    conn: AsyncConnection,
    tenant: str,
    agent_id: str,
    stream: str,
    entry_id: str,
    issue_id: str,
    detail: dict[str, str],
) -> None:
    """The ISSUE_ASSIGNED event of a dispatch row just written, in the row's transaction."""
    await conn.execute(
        events.insert().values(
            tenant=tenant,
            kind="ISSUE_ASSIGNED",
            agent_id=agent_id,
            stream=stream,
            entry_id=entry_id,
            issue_id=issue_id,
            detail=detail,
        )
    )


async def remembered_epochs(engine: AsyncEngine, *, tenant: str) -> dict[str, str]:
    """stream -> the Redis epoch marker last recorded beside it."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(redis_epochs.c.stream, redis_epochs.c.epoch).where(
                redis_epochs.c.tenant == tenant
            )
        )
        return {stream: epoch for stream, epoch in rows}


async def remember_epoch(engine: AsyncEngine, *, tenant: str, stream: str, epoch: str) -> None:
    statement = insert(redis_epochs).values(tenant=tenant, stream=stream, epoch=epoch)
    async with engine.begin() as conn:
        await conn.execute(
            statement.on_conflict_do_update(
                index_elements=["tenant", "stream"],
                set_={"epoch": epoch, "recorded_at": statement.excluded.recorded_at},
            )
        )


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A dispatch whose entry is neither done nor dead-lettered. One recorded before migration
    0006 kept the fields has none (`appendable` False): it cannot be appended again."""

    dispatch: RecentDispatch
    created_at: datetime
    appendable: bool


# The dispatches of one stream within the window whose current entry is neither done nor
# dead-lettered, started or not, or done with outputs not yet published, in keyset pages:
# (created_at, key) never changes when a row follows a new entry, so a page boundary holds
# while the rows are rewritten.
_UNFINISHED = text(
    """
    SELECT d.idempotency_key, d.entry_id, d.issue_id, d.agent_id, d.fields, d.created_at
      FROM dispatches d
      LEFT JOIN assignments a
        ON a.tenant = d.tenant AND a.stream = d.stream AND a.entry_id = d.entry_id
     WHERE d.tenant = :tenant AND d.stream = :stream
       AND d.created_at > now() - make_interval(secs => :window_s)
       AND (a.state IS NULL OR a.state NOT IN ('done', 'dead')
            OR (a.state = 'done' AND a.outputs IS NOT NULL AND a.published_at IS NULL))
       AND (CAST(:after_at AS timestamptz) IS NULL
            OR (d.created_at, d.idempotency_key) > (CAST(:after_at AS timestamptz), :after_key))
     ORDER BY d.created_at, d.idempotency_key
     LIMIT :limit
    """
)


async def unfinished(
    engine: AsyncEngine,
    *,
    tenant: str,
    stream: str,
    window_s: float,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Unfinished]:
    """One page of the stream's unfinished dispatches, oldest first, after `after` (the last
    page's (created_at, key))."""
    params = {
        "tenant": tenant,
        "stream": stream,
        "window_s": window_s,
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


@dataclass(frozen=True, slots=True)
class Carry:
    """An accepted completion whose outputs Redis lost before anyone published them: the new
    entry takes it over (done, the same attempt and outputs), so its holder publishes them."""

    attempt: int
    consumer: str | None
    outputs: list[dict[str, str]]
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Fence:
    """A lost entry fenced off: who was on it before (None: nobody had reported on it), and the
    accepted completion the new entry carries over, if its outputs were still unpublished."""

    state: str | None
    consumer: str | None
    carry: Carry | None = None


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


# The lost entry's attempts in the other groups that read it are fenced off alike (a done one
# whose outputs were not published is superseded too: only the first group's is carried over).
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


async def supersede(engine: AsyncEngine, *, tenant: str, dispatch: RecentDispatch) -> Fence | None:
    """Fence the dispatch's recorded entry off before it is appended again. None when the entry
    was finished meanwhile (a holder completed it and published its outputs): then it must not
    be appended."""
    params = {
        "tenant": tenant,
        "stream": dispatch.stream,
        "entry_id": dispatch.entry_id,
        "issue_id": dispatch.issue_id,
    }
    async with engine.begin() as conn:
        state, consumer, fenced = (await conn.execute(_SUPERSEDE, params)).one()
        await conn.execute(_SUPERSEDE_OTHER_GROUPS, params)
        # The row as it is now decides, not the statement's snapshot: superseded already (a
        # conductor that died before appending), or finished.
        now = (
            await conn.execute(
                select(
                    assignments.c.state,
                    assignments.c.attempt,
                    assignments.c.consumer,
                    assignments.c.outputs,
                    assignments.c.published_at,
                    assignments.c.group_name,
                ).where(
                    assignments.c.tenant == tenant,
                    assignments.c.stream == dispatch.stream,
                    assignments.c.entry_id == dispatch.entry_id,
                )
            )
        ).one()
    if not fenced and now.state != "superseded":
        return None
    carry = None
    if isinstance(now.outputs, list) and now.outputs and now.published_at is None:
        carry = Carry(now.attempt, now.consumer, now.outputs, now.group_name)
    return Fence(state, consumer, carry)
