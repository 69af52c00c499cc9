"""The writes of a recovery after Redis lost its data: the epoch markers (set in Redis,
remembered in PostgreSQL), each lost entry fenced off and its dispatch appended again (or the
entry a retry appended followed), and the lines that say so. `reaper.redis_loss` decides what
was lost and what each dispatch needs (`policy.redis_loss`); a dry run's `DRY RUN:` lines are
here too (`Would`), and it writes nothing, not even the marker: the next real scan recovers."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import dispatches, recovery_writes
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.domain import AssignmentState, EntryId, StreamKey
from rig_conductor.effects import redispatch

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics
    from rig_conductor.policy import redis_loss as policy

# The lines keep the logger they had when the reaper wrote them itself: operators filter on it.
logger = logging.getLogger(logs.REDIS_LOSS_LOGGER)

REASON = "redis-data-loss"


@dataclass(slots=True)
class Tally:
    """What the recovery of one stream did (in a dry run: would do) with its dispatches."""

    appended: int = 0
    present: int = 0  # Redis holds them (dispatched again since, by a client's retry)
    finished: int = 0  # completed or dead-lettered while this ran: not appended
    elsewhere: int = 0  # another conductor appended them first
    unrecorded: int = 0  # recorded without their fields (before migration 0006)


@dataclass(frozen=True, slots=True)
class Recovering:
    """The writes of the recoveries of one scan: the real ones."""

    engine: AsyncEngine
    tenant: str
    remember_s: int
    metrics: Metrics | None

    # Whether the dispatches a recovery finds missing are in Redis once it is done.
    fixes = True

    async def first_sight(self, client: AnyRedis, stream: StreamKey) -> None:
        """A stream whose epoch nobody remembers yet: set a marker, remember it."""
        epoch, _ = await redis_writes.claim_epoch(client, stream=stream, epoch=_new_epoch())
        await pg_writes.remember_epoch(self.engine, tenant=self.tenant, stream=stream, epoch=epoch)
        logger.info("Redis epoch of %s recorded: %s", stream, epoch)

    async def lost(self, client: AnyRedis, stream: StreamKey, in_redis: str | None) -> str | None:
        """Redis lost the stream's data: say so, and set a new marker (before appending, so two
        conductors agree on it); the marker, remembered by `recovered` at the end."""
        _log_lost(stream, in_redis, dry="")
        epoch, _ = await redis_writes.claim_epoch(client, stream=stream, epoch=_new_epoch())
        return epoch

    async def recover(
        self,
        client: AnyRedis,
        dispatch: dispatches.RecentDispatch,
        action: policy.Dispatch,
        marker: str | None,
        tally: Tally,
        expected: list[str],
    ) -> None:
        """Fence the lost entry's attempt, then append the dispatch again (or follow the entry a
        retry of the dispatch appended already) and record where it lives now."""
        # Fenced before the append: a holder that completes the lost entry from now on is
        # answered 409. One that completed it first has finished it: nothing is appended then.
        fence = await recovery_writes.supersede(
            self.engine, tenant=self.tenant, dispatch=dispatch, expected=expected
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
        # Appended and recorded under the append lock: an agent that starts the new entry at
        # once waits for the rows that carry each group's finished work.
        async with recovery_writes.appending(
            self.engine, tenant=self.tenant, dispatch=dispatch
        ) as conn:
            if action == "append":
                entry_id, appended = await redispatch.append_dispatch(
                    client, dispatch, remember_s=self.remember_s
                )
            else:
                assert marker is not None
                entry_id, appended = EntryId(marker), False
            recorded = await recovery_writes.reappended(
                conn,
                tenant=self.tenant,
                dispatch=dispatch,
                entry_id=entry_id,
                carries=fence.carries,
            )
        if not recorded:
            tally.elsewhere += 1
            return
        tally.appended += 1
        _log_appended(dispatch, entry_id, appended=appended, fence=fence)

    async def recovered(self, stream: StreamKey, epoch: str | None, tally: Tally) -> None:
        """Every unfinished dispatch seen to: the new marker remembered, the sum said, counted."""
        if epoch is not None:
            await pg_writes.remember_epoch(
                self.engine, tenant=self.tenant, stream=stream, epoch=epoch
            )
        _log_recovered(stream, tally, dry="")
        if self.metrics is not None:
            self.metrics.redis_data_losses.labels(stream).inc()
            self.metrics.redispatched.labels(stream, REASON).inc(tally.appended)


class Would(Recovering):
    """A dry run's recoveries: the same lines, prefixed `DRY RUN:`, nothing written or
    counted; a stream seen for the first time gets no marker."""

    fixes = False

    async def first_sight(self, client: AnyRedis, stream: StreamKey) -> None:
        return None

    async def lost(self, client: AnyRedis, stream: StreamKey, in_redis: str | None) -> str | None:
        _log_lost(stream, in_redis, dry="DRY RUN: ")
        return None

    async def recover(
        self,
        client: AnyRedis,
        dispatch: dispatches.RecentDispatch,
        action: policy.Dispatch,
        marker: str | None,
        tally: Tally,
        expected: list[str],
    ) -> None:
        tally.appended += 1
        redispatch.would_append(dispatch, logger=logger)

    async def recovered(self, stream: StreamKey, epoch: str | None, tally: Tally) -> None:
        _log_recovered(stream, tally, dry="DRY RUN: ")


def _log_lost(stream: StreamKey, in_redis: str | None, *, dry: str) -> None:
    logger.warning(
        "%sRedis lost its data: the epoch marker beside %s is %s (Redis restarted without "
        "persistence, was flushed, or failed over to an empty replica). Appending every "
        "unfinished dispatch again from PostgreSQL",
        dry,
        stream,
        "gone" if in_redis is None else f"{in_redis}, not the one remembered",
        extra={"stream": stream, "reason": REASON},
    )


def _log_recovered(stream: StreamKey, tally: Tally, *, dry: str) -> None:
    logger.warning(
        "%sRedis data loss on %s: %d dispatches appended again, %d there already, %d appended "
        "by another conductor, %d finished meanwhile, %d recorded without their fields (cannot "
        "be appended: dispatch them again)",
        dry,
        stream,
        tally.appended,
        tally.present,
        tally.elsewhere,
        tally.finished,
        tally.unrecorded,
        extra={"stream": stream, "reason": REASON, "redispatched": tally.appended},
    )


def _log_appended(
    dispatch: dispatches.RecentDispatch,
    entry_id: str,
    *,
    appended: bool,
    fence: recovery_writes.Fence,
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
