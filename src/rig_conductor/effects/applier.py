"""The one place where a reclaim plan takes effect: the guarded XCLAIMs and the dead letters in
Redis, the event-log rows (`effects.journal`), the metrics and every `[StreamReclaim]` line.

The reaper's sweep hands an `Applier` the plan of each chunk of a group as it is made; the
console's move hands it one plan (`apply`). The scan's or the request's port (`effects.port`)
hands the applier out; a dry run's hands out `DryRun`, an applier that writes nothing, to
Redis or anywhere: it logs what it would do and counts it.
Decides nothing: what moves where, and what is worn out, is the plan's (`policy.reclaim`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from rig_conductor import logs
from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import (
    DEAD_LETTER_REASON,
    UNKNOWN_AGENT,
    ConsumerName,
    EntryId,
    PendingEntry,
)
from rig_conductor.effects import dead_letters
from rig_conductor.effects import journal as records
from rig_conductor.effects.journal import Journal, Timing, no_timing
from rig_conductor.policy import reclaim
from rig_conductor.scan_report import GroupOutcome

if TYPE_CHECKING:
    from rig_conductor.metrics import Metrics

# The one logger of the [StreamReclaim] lines. It keeps the name it had when the scan wrote them
# all itself: operators filter on it.
logger = logging.getLogger(logs.RECLAIM_LOGGER)

WOULD_RECLAIM = (
    "[StreamReclaim] DRY RUN: would reclaim {entryId} on {stream}: {fromConsumer} -> {toConsumer}"
    " ({reason})"
)

__all__ = ["Applied", "Applier", "DryRun", "Journal", "Timing", "apply"]


@dataclass(eq=False)
class Applier:
    """The effects of one group's plans, as they come: `apply` each plan, then `flush` (the
    rows of what moved, even when the sweep failed half-way), then `finish` once.

    One INFO line per moved or dead-lettered entry (reaper rule 8, docs/rules.md), written a page at
    a time (`logs.log_lines`); one RECLAIMED row per page of moved entries, one DEAD_LETTERED
    row per dead letter; the counters when `metrics` is given.
    """

    assessment: reclaim.GroupAssessment
    _: KW_ONLY
    redis: Redis
    journal: Journal
    metrics: Metrics | None
    timing: Timing = no_timing
    # (owner, target) -> how many entries moved from one to the other.
    moved: dict[tuple[ConsumerName, ConsumerName], int] = field(default_factory=dict)
    # Qualifying entries worn out, with the count that decided it: dead-lettered by `finish`.
    worn: list[PendingEntry] = field(default_factory=list)
    # Per owner, qualifying entries left in place because no target could take them.
    no_target: dict[ConsumerName, int] = field(default_factory=dict)
    # Entries chosen for a move but left by the guard: acked, re-read or trimmed meanwhile.
    skipped: int = 0
    # The ids `finish` dead-lettered (in a dry run: would have).
    dead_lettered: list[EntryId] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.agents = {t.consumer: t.agent for t in self.assessment.targets}
        self._recorder = records.Recorder(
            self.assessment, self.journal, agents=self.agents, timing=self.timing
        )

    async def apply(self, plan: reclaim.ReclaimPlan) -> list[list[EntryId]]:
        """Claim what `plan` moves, each claim guarded by its min-idle, and log and record
        each stretch that moved; keep its worn entries and those without a target for
        `finish`. Per claim of the plan, the ids that moved."""
        self.worn.extend(plan.dead_letters)
        no_target = self.no_target
        for entry in plan.no_target:
            no_target[entry.consumer] = no_target.get(entry.consumer, 0) + 1
        batches = [
            redis_writes.ClaimBatch(claim.target, claim.min_idle_ms, [e.id for e in claim.entries])
            for claim in plan.claims
        ]
        claimed = await self._claim(batches)
        for batch, ids in zip(batches, claimed, strict=True):
            self.skipped += len(batch.ids) - len(ids)
        self._delays(plan.claims, claimed)
        for owner, target, ids in _stretches(plan.claims, claimed):
            key = (owner, target)
            self.moved[key] = self.moved.get(key, 0) + len(ids)
            self._moved(owner, target, ids)
        return claimed

    async def flush(self) -> None:
        """Write the rows of the moves not yet recorded; raise what a write raised."""
        await self._recorder.close()

    async def finish(self) -> GroupOutcome:
        """After the last plan: the lines of what was left in place, the dead letters, the
        counters; what the group's plans did, for the scan report."""
        assessment = self.assessment
        outcome = _outcome(assessment, self.moved, self.no_target, self.skipped)
        _log_left_degraded(assessment)
        _log_no_target(assessment, self.no_target)
        if self.worn:
            await self._dead_letter(outcome)
        if self.skipped and self.journal.by is None:
            # An operator's move says what the guard kept in its own [Console] line and page.
            logger.info(
                "[StreamReclaim] Left %d entries on %s/%s: trimmed from the stream or touched "
                "since the scan looked",
                self.skipped,
                assessment.stream,
                assessment.group,
            )
        if self.metrics is not None:
            self._count(outcome, self.metrics)
        return outcome

    # The effects themselves: `DryRun` has its own.

    async def _claim(self, batches: list[redis_writes.ClaimBatch]) -> list[list[EntryId]]:
        a = self.assessment
        with self.timing("claim"):
            return await redis_writes.claim(
                self.redis, stream=a.stream, group=a.group, batches=batches
            )

    def _moved(self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]) -> None:
        with self.timing("log"):
            self._log_moved(owner, target, ids)
        self._recorder.moved(owner, target, ids)

    def _log_moved(self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]) -> None:
        if not logger.isEnabledFor(logging.INFO):
            return
        assessment, rule = self.assessment, self.assessment.rules[owner]
        common: dict[str, object] = {
            "stream": assessment.stream,
            "group": assessment.group,
            "fromConsumer": owner,
            "toConsumer": target,
            "fromAgent": rule.agent,
            "toAgent": self.agents.get(target),
            "reason": rule.reason,
        }
        if self.journal.by is not None:
            common["by"] = self.journal.by
        for batch in records.pages(ids):
            lines = logs.Lines.filled(logs.RECLAIMED, "entryId", batch, common)
            logs.log_lines(logger, logging.INFO, lines)

    async def _dead_letter(self, outcome: GroupOutcome) -> None:
        """Reaper step 7: each worn entry copied to the DLQ and acked (guarded like a move), a
        line and a DEAD_LETTERED row each, its assignment marked dead."""
        a, worn = self.assessment, self.worn
        with self.timing("deadLetter"):
            dead = await redis_writes.dead_letter(
                self.redis, stream=a.stream, group=a.group, entries=worn, reason=DEAD_LETTER_REASON
            )
            owners = {entry.id: entry.consumer for entry in worn}
            _log_dead_lettered(a, dead, owners)
            outcome.dead_lettered = len(dead)
            for item in dead:
                outcome.changes[owners[item.entry_id]] -= 1
            outcome.skipped += len(worn) - len(dead)
            dlq_stream = redis_streams.dlq_key(a.stream, self.redis)
            await records.record_dead_letters(
                self.journal, a, dead, owners=owners, dlq_stream=dlq_stream
            )
        self.dead_lettered = [item.entry_id for item in dead]

    def _delays(self, claims: Sequence[reclaim.Claim], claimed: list[list[EntryId]]) -> None:
        """How long each moved entry had sat idle (`rig_reclaim_delay_seconds`)."""
        if self.metrics is None:
            return
        a = self.assessment
        for claim, ids in zip(claims, claimed, strict=True):
            if not ids:
                continue
            moved = set(ids)
            histogram = self.metrics.reclaim_delay.labels(
                a.stream, a.group, a.rules[claim.owner].reason
            )
            for entry in claim.entries:
                if entry.id in moved:
                    histogram.observe(entry.idle_ms / 1000)

    def _count(self, outcome: GroupOutcome, metrics: Metrics) -> None:
        stream, group, rules = self.assessment.stream, self.assessment.group, self.assessment.rules
        for (owner, target), count in self.moved.items():
            rule = rules[owner]
            metrics.reclaimed.labels(
                stream,
                group,
                rule.agent or UNKNOWN_AGENT,
                self.agents.get(target) or UNKNOWN_AGENT,
                rule.reason,
            ).inc(count)
        if outcome.dead_lettered:
            metrics.dead_lettered.labels(stream, group).inc(outcome.dead_lettered)
        if outcome.no_target:
            metrics.no_target.labels(stream, group).inc(outcome.no_target)


class DryRun(Applier):
    """The same plans, nothing written: no claim, no dead letter, no row, no counter. Every
    entry a claim names counts as moved (the guard is not asked), and each gets its line."""

    async def _claim(self, batches: list[redis_writes.ClaimBatch]) -> list[list[EntryId]]:
        return [list(batch.ids) for batch in batches]

    def _delays(self, claims: Sequence[reclaim.Claim], claimed: list[list[EntryId]]) -> None:
        return None

    def _moved(self, owner: ConsumerName, target: ConsumerName, ids: list[EntryId]) -> None:
        _log_would_move(self.assessment, owner, target, ids)

    async def flush(self) -> None:
        return None

    async def finish(self) -> GroupOutcome:
        outcome = await super().finish()
        # Nothing moved in Redis: the scan's counts of pending entries stay as it read them.
        outcome.changes.clear()
        return outcome

    async def _dead_letter(self, outcome: GroupOutcome) -> None:
        for entry in self.worn:
            dead_letters.would_dead_letter(entry.id, self.assessment.stream, entry.deliveries)
        outcome.dead_lettered = len(self.worn)
        self.dead_lettered = [entry.id for entry in self.worn]

    def _count(self, outcome: GroupOutcome, metrics: Metrics) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Applied:
    """What one plan did: the counts, and the ids that moved and were dead-lettered."""

    outcome: GroupOutcome
    moved: list[EntryId]
    dead_lettered: list[EntryId]


async def apply(applier: Applier, plan: reclaim.ReclaimPlan) -> Applied:
    """`plan` takes effect in one go through `applier` (a `DryRun`: is logged): a move by hand."""
    try:
        claimed = await applier.apply(plan)
    finally:
        await applier.flush()
    outcome = await applier.finish()
    moved = [entry_id for ids in claimed for entry_id in ids]
    return Applied(outcome, moved, applier.dead_lettered)


def _stretches(
    claims: Sequence[reclaim.Claim], claimed: list[list[EntryId]]
) -> Iterator[tuple[ConsumerName, ConsumerName, list[EntryId]]]:
    """What moved, claim after claim, as (owner, target, ids): consecutive claims of one owner
    for one target (a move by hand claims each entry on its own) make one stretch, so one
    RECLAIMED row."""
    owner = target = ConsumerName("")
    run: list[EntryId] = []
    for claim, ids in zip(claims, claimed, strict=True):
        if not ids:
            continue
        if run and (claim.owner, claim.target) == (owner, target):
            run = [*run, *ids]
            continue
        if run:
            yield owner, target, run
        owner, target, run = claim.owner, claim.target, ids
    if run:
        yield owner, target, run


def _outcome(
    assessment: reclaim.GroupAssessment,
    moved: Mapping[tuple[ConsumerName, ConsumerName], int],
    no_target: Mapping[ConsumerName, int],
    skipped: int,
) -> GroupOutcome:
    outcome = GroupOutcome(stream=assessment.stream, group=assessment.group)
    by_reason = outcome.reclaimed_by_reason
    for (owner, target), count in moved.items():
        reason = assessment.rules[owner].reason
        outcome.targets[target] = outcome.targets.get(target, 0) + count
        by_reason[reason] = by_reason.get(reason, 0) + count
        outcome.changes[owner] -= count
        outcome.changes[target] += count
    outcome.reclaimed = sum(moved.values())
    outcome.no_target = sum(no_target.values())
    outcome.degraded_held = sum(assessment.left_degraded.values())
    outcome.skipped = skipped
    return outcome


def _log_would_move(
    assessment: reclaim.GroupAssessment,
    owner: ConsumerName,
    target: ConsumerName,
    ids: list[EntryId],
) -> None:
    """A dry run's line per entry it would move, a page at a time."""
    if not logger.isEnabledFor(logging.INFO):
        return
    reason = assessment.rules[owner].reason
    parts = {"stream": assessment.stream, "fromConsumer": owner, "toConsumer": target}
    for batch in records.pages(ids):
        sentences = logs.Framed.of(WOULD_RECLAIM, "entryId", batch, reason=reason, **parts)
        logs.log_lines(logger, logging.INFO, logs.Lines(sentences, {"reason": reason}))


def _log_dead_lettered(
    assessment: reclaim.GroupAssessment,
    dead: list[redis_streams.DeadLettered],
    owners: Mapping[EntryId, ConsumerName],
) -> None:
    for item in dead:
        dead_letters.log_dead_lettered(
            assessment.stream, assessment.group, owners[item.entry_id], item
        )


def _log_left_degraded(assessment: reclaim.GroupAssessment) -> None:
    for consumer, count in assessment.left_degraded.items():
        logger.warning(
            "[StreamReclaim] %s in group %s of %s has been degraded past the grace period, but "
            "no non-degraded consumer can take its %d entries; left in place",
            consumer,
            assessment.group,
            assessment.stream,
            count,
            extra={
                "stream": assessment.stream,
                "group": assessment.group,
                "fromConsumer": consumer,
                "entries": count,
                "reason": "degraded",
            },
        )


def _log_no_target(
    assessment: reclaim.GroupAssessment, stranded: Mapping[ConsumerName, int]
) -> None:
    for consumer, count in stranded.items():
        logger.warning(
            "[StreamReclaim] No live consumer in group %s of %s to take %d entries of %s; "
            "left in place",
            assessment.group,
            assessment.stream,
            count,
            consumer,
            extra={
                "stream": assessment.stream,
                "group": assessment.group,
                "fromConsumer": consumer,
                "entries": count,
                "reason": assessment.rules[consumer].reason,
            },
        )
