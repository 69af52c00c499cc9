"""After Redis lost its data: which dispatches are unfinished (the fences and the record of
appending a dispatch again, with what each group had finished carried over to the new entry,
are the port's writes: `recovery_writes`). Decides nothing: `reaper.redis_loss` does.

Work is owned per group, so a dispatch is unfinished when any group that reads its stream has
not finished it: its first group (`assignments`), a group with a row of its own
(`group_assignments`), or a group that read the stream's entries since before this dispatch and
never reported on this one (it had not read it yet: a lagging group's backlog is lost with
Redis too). The new entry is one stream entry for every group, so each group that had finished
the old one gets a done row on the new one: its holder is answered "done" and acks, publishing
first what was accepted and not published yet. A group that has not finished it runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from rig_conductor.adapters.postgres.dispatches import RecentDispatch


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


# The lock a recovery's append holds until the new entry's rows are written
# (`recovery_writes.appending`), and the first start of an entry waits on (shared): keyed by
# tenant, stream and issue, as the agent reports them.
_WAIT_FOR_APPEND = text("SELECT pg_advisory_xact_lock_shared(hashtextextended(:key, 0))")


def lock_key(tenant: str, stream: str, issue_id: str) -> str:
    return f"{tenant}\x1f{stream}\x1f{issue_id}"


async def wait_for_append(
    conn: AsyncConnection, *, tenant: str, stream: str, issue_id: str | None
) -> None:
    """Wait, in a WORK_STARTED's transaction, for a recovery appending this issue's dispatch
    again to have written the new entry's rows (`appending`)."""
    if issue_id is not None:
        await conn.execute(_WAIT_FOR_APPEND, {"key": lock_key(tenant, stream, issue_id)})
