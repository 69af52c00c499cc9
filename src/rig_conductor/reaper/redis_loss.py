"""Redis that lost its data: found by the epoch marker, every unfinished dispatch appended again.

Redis restarted without persistence, flushed, or failed over to an empty replica has lost every
stream, group, pending list and idempotency marker at once. `redispatch` only looks at recent
dispatches nobody started; this looks, once per loss, at every dispatch of the stream within
the event retention that is neither done nor dead-lettered, started or not, and appends each
again through the at-most-once script under its idempotency key, so two conductors, or a client
retrying at the same moment, still make one entry. The lost entry is fenced off first
(`superseded`): an agent that had it in hand when Redis lost it is answered 409 when it reports,
and only the new entry's completion counts. So at most the entries held in hand run twice, and
none is committed twice.

A loss is told by the epoch marker the conductor keeps beside each dispatch stream and
remembers in PostgreSQL (`policy.redis_loss.judge_epoch`). After a loss the first conductor to
look sets a new marker; the new one is remembered only once every unfinished dispatch has been
appended, so a conductor that dies half-way leaves the job to the next scan.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import dispatches, recovery
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import AnyRedis, Topology, node_for
from rig_conductor.domain import AssignmentState, EntryId, StreamKey
from rig_conductor.policy import redis_loss
from rig_conductor.reaper import redispatch
from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

logger = logging.getLogger(__name__)

PAGE = 1_000  # unfinished dispatches read, and their markers looked up, at a time
REASON = "redis-data-loss"


@dataclass(slots=True)
class Recovery:
    """What a look at the epochs found and did (in a dry run: would do)."""

    lost: list[str]  # streams whose Redis lost its data
    appended: int = 0  # dispatches appended again, or whose record followed another's append


@dataclass(slots=True)
class _Tally:
    appended: int = 0
    present: int = 0  # Redis holds them (dispatched again since, by a client's retry)
    finished: int = 0  # completed or dead-lettered while this ran: not appended
    elsewhere: int = 0  # another conductor appended them first
    unrecorded: int = 0  # recorded without their fields (before migration 0006)


async def recover(
    topology: Topology,
    *,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool,
    metrics: Metrics | None = None,
) -> Recovery:
    """Look at the epoch of every dispatch stream; after a loss, append its unfinished
    dispatches again. Raises on Redis or PostgreSQL failure (the next scan tries again)."""
    remembered = await dispatches.remembered_epochs(engine, tenant=settings.tenant)
    streams = sorted({settings.dispatch_stream, *remembered})
    found = Recovery(lost=[])
    for name in streams:
        stream = StreamKey(name)
        client = (await node_for(topology, stream)).client
        in_redis = await redis_streams.read_epoch(client, stream=stream)
        verdict = redis_loss.judge_epoch(in_redis=in_redis, remembered=remembered.get(stream))
        if verdict == "same" or (dry_run and verdict == "first-sight"):
            continue
        if verdict == "first-sight":
            epoch, _ = await redis_streams.claim_epoch(client, stream=stream, epoch=_new_epoch())
            await dispatches.remember_epoch(
                engine, tenant=settings.tenant, stream=stream, epoch=epoch
            )
            logger.info("Redis epoch of %s recorded: %s", stream, epoch)
            continue
        found.lost.append(stream)
        appended = await _recover_stream(
            client, stream, in_redis, engine=engine, settings=settings, dry_run=dry_run
        )
        found.appended += appended
        if metrics is not None and not dry_run:
            metrics.redis_data_losses.labels(stream).inc()
            metrics.redispatched.labels(stream, REASON).inc(appended)
    return found


async def _recover_stream(
    client: AnyRedis,
    stream: StreamKey,
    in_redis: str | None,
    *,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool,
) -> int:
    logger.warning(
        "%sRedis lost its data: the epoch marker beside %s is %s (Redis restarted without "
        "persistence, was flushed, or failed over to an empty replica). Appending every "
        "unfinished dispatch again from PostgreSQL",
        "DRY RUN: " if dry_run else "",
        stream,
        "gone" if in_redis is None else f"{in_redis}, not the one remembered",
        extra={"stream": stream, "reason": REASON},
    )
    epoch = None
    if not dry_run:
        # Set before appending, so two conductors agree on it; remembered only at the end.
        epoch, _ = await redis_streams.claim_epoch(client, stream=stream, epoch=_new_epoch())
    tally = _Tally()
    window_s = settings.event_retention_days * 86_400
    groups = await recovery.groups_since(engine, tenant=settings.tenant, stream=stream)
    after: tuple[datetime, str] | None = None
    while True:
        page = await recovery.unfinished(
            engine,
            tenant=settings.tenant,
            stream=stream,
            window_s=window_s,
            groups=groups,
            after=after,
            limit=PAGE,
        )
        if not page:
            break
        after = (page[-1].created_at, page[-1].dispatch.key)
        markers = await redis_streams.dispatch_markers(
            client, items=[(stream, item.dispatch.key) for item in page]
        )
        for item, marker in zip(page, markers, strict=True):
            expected = recovery.expected_groups(groups, item)
            await _recover_dispatch(
                client,
                item,
                marker,
                tally,
                expected,
                engine=engine,
                settings=settings,
                dry_run=dry_run,
            )
    if epoch is not None:
        await dispatches.remember_epoch(engine, tenant=settings.tenant, stream=stream, epoch=epoch)
    logger.warning(
        "%sRedis data loss on %s: %d dispatches appended again, %d there already, %d appended "
        "by another conductor, %d finished meanwhile, %d recorded without their fields (cannot "
        "be appended: dispatch them again)",
        "DRY RUN: " if dry_run else "",
        stream,
        tally.appended,
        tally.present,
        tally.elsewhere,
        tally.finished,
        tally.unrecorded,
        extra={"stream": stream, "reason": REASON, "redispatched": tally.appended},
    )
    return tally.appended


async def _recover_dispatch(
    client: AnyRedis,
    item: recovery.Unfinished,
    marker: str | None,
    tally: _Tally,
    expected: list[str],
    *,
    engine: AsyncEngine,
    settings: Settings,
    dry_run: bool,
) -> None:
    dispatch = item.dispatch
    action = redis_loss.judge_dispatch(recorded_entry=dispatch.entry_id, marker=marker)
    if action == "keep":
        tally.present += 1
        return
    if action == "append" and not item.appendable:
        tally.unrecorded += 1
        logger.error(
            "Dispatch %s (entry %s) was lost with Redis's data and cannot be appended again: "
            "it was recorded before its fields were kept. Dispatch it again",
            dispatch.issue_id,
            dispatch.entry_id,
            extra={"issueId": dispatch.issue_id, "stream": dispatch.stream},
        )
        return
    if dry_run:
        tally.appended += 1
        logger.warning(
            "DRY RUN: would append dispatch %s again: %s is missing from %s",
            dispatch.issue_id,
            dispatch.entry_id,
            dispatch.stream,
        )
        return
    await _fence_and_append(
        client, dispatch, action, marker, tally, expected, engine=engine, settings=settings
    )


async def _fence_and_append(
    client: AnyRedis,
    dispatch: dispatches.RecentDispatch,
    action: redis_loss.Dispatch,
    marker: str | None,
    tally: _Tally,
    expected: list[str],
    *,
    engine: AsyncEngine,
    settings: Settings,
) -> None:
    """Fence the lost entry's attempt, then append the dispatch again (or follow the entry a
    retry of the dispatch appended already) and record where it lives now."""
    # Fenced before the append: a holder that completes the lost entry from now on is
    # answered 409. One that completed it first has finished it: nothing is appended then.
    fence = await recovery.supersede(
        engine, tenant=settings.tenant, dispatch=dispatch, expected=expected
    )
    if fence is None:
        tally.finished += 1
        if action == "follow":
            logger.warning(
                "Dispatch %s was completed as %s, lost with Redis's data, and appended again "
                "as %s by a retry of its dispatch: it may run twice",
                dispatch.issue_id,
                dispatch.entry_id,
                marker,
            )
        return
    # Appended and recorded under the append lock: an agent that starts the new entry at once
    # waits for the rows that carry each group's finished work.
    async with recovery.appending(engine, tenant=settings.tenant, dispatch=dispatch) as conn:
        if action == "append":
            entry_id, appended = await redispatch.append_dispatch(
                client, dispatch, settings=settings
            )
        else:
            assert marker is not None
            entry_id, appended = EntryId(marker), False
        recorded = await recovery.reappended(
            conn,
            tenant=settings.tenant,
            dispatch=dispatch,
            entry_id=entry_id,
            carries=fence.carries,
        )
    if not recorded:
        tally.elsewhere += 1
        return
    tally.appended += 1
    _log_appended(dispatch, entry_id, appended=appended, fence=fence)


def _log_appended(
    dispatch: dispatches.RecentDispatch, entry_id: str, *, appended: bool, fence: recovery.Fence
) -> None:
    if fence.carry is not None:
        held = (
            f"; its completion (attempt {fence.carry.attempt}) was accepted and its outputs are "
            "not published yet: the new entry's holder publishes them"
        )
    elif fence.consumer and fence.state in (AssignmentState.RUNNING, AssignmentState.PENDING):
        held = f"; the attempt {fence.consumer} held is fenced off"
    else:
        held = ""
    logger.warning(
        "Dispatch %s was missing from %s (entry %s, lost with Redis's data); %s as %s%s",
        dispatch.issue_id,
        dispatch.stream,
        dispatch.entry_id,
        "appended again" if appended else "already appended again",
        entry_id,
        held,
        extra={
            "issueId": dispatch.issue_id,
            "stream": dispatch.stream,
            "entryId": entry_id,
            "replaces": dispatch.entry_id,
            "reason": REASON,
        },
    )


def _new_epoch() -> str:
    return uuid.uuid4().hex
