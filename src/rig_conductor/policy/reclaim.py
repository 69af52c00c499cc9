"""The reclaim plan for one consumer group: the contract's Reaper rules 3 to 7.

Pure: stdlib and domain only. The scan calls it in two steps, so it reads only the pending
lists it needs:
1. `assess_group` judges every consumer that holds entries and picks the target, from
   XINFO alone. Only the consumers it finds down have their pending lists read.
2. `plan_reclaims` sorts those entries into moves, dead letters and entries with no target.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rig_conductor.domain import (
    ConsumerName,
    EntryId,
    Evidence,
    GroupInfo,
    GroupName,
    Limits,
    PendingEntry,
    StreamKey,
)
from rig_conductor.policy.liveness import (
    OwnerVerdict,
    TargetCandidate,
    judge_owner,
    target_candidate,
)


@dataclass(frozen=True, slots=True)
class GroupAssessment:
    stream: StreamKey
    group: GroupName
    # Consumers that hold pending entries and are down by rule 3.
    down: Mapping[ConsumerName, OwnerVerdict]
    target: TargetCandidate | None

    def min_idle_ms(self, consumer: ConsumerName, limits: Limits) -> int:
        """The least idle time an entry of this consumer needs to be reclaimed (rule 4).

        A pod Kubernetes reports gone can never ack, so its entries qualify at any idle time.
        """
        verdict = self.down[consumer]
        return 0 if verdict.pod_gone else limits.entry_stale_ms


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    """What to do with the entries of one group. Moves all go to `assessment.target`."""

    assessment: GroupAssessment
    moves: tuple[PendingEntry, ...]
    dead_letters: tuple[PendingEntry, ...]
    no_target: tuple[PendingEntry, ...]

    @property
    def empty(self) -> bool:
        return not (self.moves or self.dead_letters or self.no_target)


def assess_group(group: GroupInfo, evidence: Evidence, limits: Limits) -> GroupAssessment:
    down: dict[ConsumerName, OwnerVerdict] = {}
    for info in group.consumers:
        if info.pending > 0:
            verdict = judge_owner(info.name, evidence, limits)
            if verdict.down:
                down[info.name] = verdict
    target = pick_target(group, evidence, limits) if down else None
    return GroupAssessment(group.stream, group.name, down, target)


def pick_target(group: GroupInfo, evidence: Evidence, limits: Limits) -> TargetCandidate | None:
    """Rule 5: the best consumer of the group that is alive by its own evidence."""
    candidates = (target_candidate(info, evidence, limits) for info in group.consumers)
    return min((c for c in candidates if c is not None), key=TargetCandidate.rank, default=None)


def plan_reclaims(
    assessment: GroupAssessment,
    entries: Iterable[PendingEntry],
    limits: Limits,
    attempts: Mapping[EntryId, int] | None = None,
) -> ReclaimPlan:
    """Rules 4 and 7 for each entry: reclaim only from a down owner, dead-letter the worn out
    (dead letters carry the count that decided it).

    An entry is worn out when the truer of its two counts has reached RIG_MAX_DELIVERIES: the
    Redis delivery count, or the attempts recorded in PostgreSQL (`attempts`, which need only
    hold the entries with many). A crash before WORK_STARTED still counts as a delivery; an
    attempt still counts if something reset the delivery count.
    The target is never an entry's owner: owners here are down and targets are not.
    """
    recorded = attempts or {}
    down = assessment.down
    stale_ms = limits.entry_stale_ms
    max_deliveries = limits.max_deliveries
    has_target = assessment.target is not None
    moves: list[PendingEntry] = []
    dead: list[PendingEntry] = []
    stuck: list[PendingEntry] = []
    for entry in entries:
        verdict = down.get(entry.consumer)
        if verdict is None:
            continue  # the owner is alive (or unknown): its entries are its own business
        if entry.idle_ms < stale_ms and not verdict.pod_gone:
            continue  # fresh: the owner may still be working on it
        count = max(entry.deliveries, recorded.get(entry.id, 0))
        if count >= max_deliveries:
            dead.append(entry._replace(deliveries=count))
        elif has_target:
            moves.append(entry)
        else:
            stuck.append(entry)
    return ReclaimPlan(assessment, tuple(moves), tuple(dead), tuple(stuck))
