"""The one write port: every change a scan or an operator makes goes through an `Effects`, built
once where the scan, the request or the command starts (`choose`), and handed down. A dry run is
the same decisions handed to `DryEffects`, which changes nothing in Redis or PostgreSQL and logs
what it would do (the `DRY RUN: would ...` lines). Below the entry points nothing asks whether a
run is dry: the port it was handed answers for it.

What a scan saw (the detector's sightings, the measurements the views show, its report) is
recorded by both:
it is not a change. Each effect lives in a module of its own (`applier`, `redispatch`,
`redis_loss`, `hygiene`, `forgetting`, `observation`, `dead_letters`); this module only hands
them out, real or dry. Decides nothing: the reaper, the operations and `policy` decide.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import logs
from rig_conductor.adapters.postgres import dispatches
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.adapters.redis.streams import DeadLetter, DeadLettered
from rig_conductor.domain import (
    ConsumerName,
    EntryId,
    FleetMeasure,
    GroupMeasure,
    GroupName,
    StreamKey,
)
from rig_conductor.effects import (
    applier,
    dead_letters,
    forgetting,
    hygiene,
    journal,
    observation,
    redis_loss,
    redispatch,
)
from rig_conductor.effects.journal import Journal, Timing, no_timing
from rig_conductor.policy import detector, registry
from rig_conductor.policy import hygiene as hygiene_policy
from rig_conductor.policy.reclaim import GroupAssessment, ReclaimPlan

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

__all__ = ["DryEffects", "Effects", "choose"]

dry_logger = logging.getLogger(logs.CONSOLE_LOGGER)


@dataclass(frozen=True, slots=True)
class Effects:
    """The writes of one scan, request or command, as they really happen.

    `remember_s`: how long a re-appended dispatch's idempotency key is remembered (as long as
    the event log keeps events); 0 for a request's port, which appends nothing again."""

    engine: AsyncEngine
    tenant: str
    metrics: Metrics | None = None
    remember_s: int = 0

    # For the reports only (`ScanReport.dry_run`): nothing branches on it.
    dry: ClassVar[bool] = False
    # What applies a reclaim plan: `DryRun`, which claims nothing, for the dry port.
    applier_kind: ClassVar[type[applier.Applier]] = applier.Applier

    # Reclaim: the applier of one group's plans (the scan's sweep), or of one plan (by hand).

    def reclaim(
        self,
        assessment: GroupAssessment,
        *,
        redis: Redis,
        timing: Timing = no_timing,
        by: str | None = None,
    ) -> applier.Applier:
        """The applier of `assessment`'s plans; `by`: the operator who asked (a move by hand)."""
        return self.applier_kind(
            assessment,
            redis=redis,
            journal=self.journal(by),
            metrics=self.metrics,
            timing=timing,
        )

    async def apply(
        self, plan: ReclaimPlan, *, redis: Redis, by: str | None = None
    ) -> applier.Applied:
        """`plan` takes effect in one go: a move by hand, in `by`'s name."""
        return await applier.apply(self.reclaim(plan.assessment, redis=redis, by=by), plan)

    def journal(self, by: str | None = None) -> Journal:
        return Journal(self.engine, self.tenant, by=by)

    # Redispatch and Redis-loss recovery.

    async def append_lost(self, redis: AnyRedis, item: dispatches.RecentDispatch) -> bool:
        """A recent dispatch Redis lost, appended again; False when another conductor did."""
        return await redispatch.append_again(
            redis,
            item,
            engine=self.engine,
            tenant=self.tenant,
            remember_s=self.remember_s,
            metrics=self.metrics,
        )

    def recovering(self) -> redis_loss.Recovering:
        """The writes of the recoveries after Redis lost its data."""
        return redis_loss.Recovering(self.engine, self.tenant, self.remember_s, self.metrics)

    # Consumer hygiene and forgetting.

    async def remove_consumers(
        self, redis: Redis, removals: Sequence[hygiene_policy.ConsumerRemoval]
    ) -> list[hygiene_policy.ConsumerRemoval]:
        """The consumers of `removals` deleted, as far as they still hold nothing; those."""
        return await hygiene.remove(redis, removals)

    async def forget(self, plan: registry.Forget, *, forget_ms: int) -> None:
        """The heartbeat rows of agents and consumers silent before `plan.before` deleted."""
        await forgetting.forget(plan, forget_ms=forget_ms, engine=self.engine, tenant=self.tenant)

    # What the scan saw: recorded in a dry run too.

    async def sightings(self, new: Sequence[detector.Sighting]) -> None:
        await observation.sightings(new, engine=self.engine, tenant=self.tenant)

    async def measured(
        self, groups: Sequence[GroupMeasure], fleet: FleetMeasure, *, complete: bool
    ) -> None:
        await observation.measured(
            groups, fleet, complete=complete, engine=self.engine, tenant=self.tenant
        )

    async def scan_requested(self, by: str, summary: Mapping[str, object]) -> None:
        """The record of a scan an operator ran from the console."""
        await journal.scan_requested(self.journal(by), summary)

    async def reported(self, report: Mapping[str, Any]) -> None:
        await observation.reported(report, engine=self.engine, tenant=self.tenant)

    # Dead letters besides the scan's: an agent's, an operator's requeue and delete.

    async def dead_letter_held(
        self,
        redis: AnyRedis,
        *,
        stream: StreamKey,
        group: GroupName,
        consumer: ConsumerName,
        agent_id: str,
        entry_id: EntryId,
        deliveries: int,
        reason: str,
    ) -> DeadLettered | None:
        return await dead_letters.dead_letter_held(
            redis,
            self.journal(),
            stream=stream,
            group=group,
            consumer=consumer,
            agent_id=agent_id,
            entry_id=entry_id,
            deliveries=deliveries,
            reason=reason,
        )

    async def requeue(
        self, redis: AnyRedis, *, stream: StreamKey, dlq_ids: Sequence[str], by: str
    ) -> dict[str, tuple[str, str | None]]:
        return await dead_letters.requeue(
            redis, self.journal(), stream=stream, dlq_ids=dlq_ids, by=by
        )

    async def delete(
        self, redis: AnyRedis, *, stream: StreamKey, letters: Sequence[DeadLetter], by: str
    ) -> list[DeadLetter]:
        return await dead_letters.delete(
            redis, self.journal(), stream=stream, letters=letters, by=by
        )


@dataclass(frozen=True, slots=True)
class DryEffects(Effects):
    """The same calls, nothing changed in Redis or PostgreSQL: each logs what it would do, as a
    dry run always has, and answers as if it had been done (nothing is counted); an operator's
    dead letters, which no dry run touches, as if there were none."""

    dry: ClassVar[bool] = True
    applier_kind: ClassVar[type[applier.Applier]] = applier.DryRun

    async def append_lost(self, redis: AnyRedis, item: dispatches.RecentDispatch) -> bool:
        redispatch.would_append(item)
        return True

    def recovering(self) -> redis_loss.Recovering:
        return redis_loss.Would(self.engine, self.tenant, self.remember_s, self.metrics)

    async def remove_consumers(
        self, redis: Redis, removals: Sequence[hygiene_policy.ConsumerRemoval]
    ) -> list[hygiene_policy.ConsumerRemoval]:
        return hygiene.would_remove(removals)

    async def forget(self, plan: registry.Forget, *, forget_ms: int) -> None:
        return None  # a dry run forgets nothing, and says nothing of it

    async def dead_letter_held(
        self,
        redis: AnyRedis,
        *,
        stream: StreamKey,
        group: GroupName,
        consumer: ConsumerName,
        agent_id: str,
        entry_id: EntryId,
        deliveries: int,
        reason: str,
    ) -> DeadLettered | None:
        dead_letters.would_dead_letter(entry_id, stream, deliveries)
        return None

    async def scan_requested(self, by: str, summary: Mapping[str, object]) -> None:
        return None

    async def requeue(
        self, redis: AnyRedis, *, stream: StreamKey, dlq_ids: Sequence[str], by: str
    ) -> dict[str, tuple[str, str | None]]:
        for dlq_id in dlq_ids:
            dry_logger.info("DRY RUN: would requeue dead letter %s of %s (%s)", dlq_id, stream, by)
        return {}

    async def delete(
        self, redis: AnyRedis, *, stream: StreamKey, letters: Sequence[DeadLetter], by: str
    ) -> list[DeadLetter]:
        for letter in letters:
            dry_logger.info(
                "DRY RUN: would delete dead letter %s of %s (%s)", letter.dlq_id, stream, by
            )
        return []


def choose(
    dry_run: bool,
    *,
    engine: AsyncEngine,
    tenant: str,
    metrics: Metrics | None = None,
    remember_s: int = 0,
) -> Effects:
    """The port of one scan, request or command: `DryEffects` in a dry run. Called once, where
    the scan, the request or the command starts."""
    kind = DryEffects if dry_run else Effects
    return kind(engine, tenant, metrics, remember_s)
