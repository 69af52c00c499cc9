"""The reclaim decision for one consumer group: the contract's Reaper rules 3 to 7.

Pure: stdlib and domain only. Two levels:
1. `assess_group` judges every consumer that holds entries and picks the target, from XINFO
   and the fleet's evidence alone. Only the consumers it finds down are looked at further.
2. `EntryRule` decides each pending entry of a down consumer: move, dead-letter or leave.
   It is small enough to state as parameters, so the Redis adapter can apply it server-side
   to a whole pending list without shipping every entry out and back (`plan_reclaims` applies
   it here, entry by entry: it is the rule's reference, and the adapter is tested against it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from rig_conductor.domain import (
    ConsumerName,
    EntryId,
    GroupInfo,
    GroupName,
    Limits,
    PendingEntry,
    StreamKey,
)
from rig_conductor.policy.liveness import Fleet, OwnerVerdict, TargetCandidate


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


def assess_group(group: GroupInfo, fleet: Fleet) -> GroupAssessment:
    down = {
        info.name: fleet.owner(info.name)
        for info in group.consumers
        if info.pending > 0 and fleet.is_down(info.name)
    }
    target = pick_target(group, fleet) if down else None
    return GroupAssessment(group.stream, group.name, down, target)


def pick_target(group: GroupInfo, fleet: Fleet) -> TargetCandidate | None:
    """Rule 5: the best consumer of the group that is alive by its own evidence."""
    candidates = (fleet.target(info) for info in group.consumers)
    return min((c for c in candidates if c is not None), key=TargetCandidate.rank, default=None)


@dataclass(frozen=True, slots=True)
class EntryRule:
    """Rules 4 and 7 for the entries of one down consumer.

    An entry qualifies when idle at least `min_idle_ms`; a qualifying entry is worn out when
    its delivery count, or its recorded attempts (`worn`: only entries with that many), reached
    `max_deliveries`. Worn entries are dead-lettered, the others move to the target.
    """

    owner: ConsumerName
    min_idle_ms: int
    max_deliveries: int
    worn: Mapping[EntryId, int]

    def decide(self, entry: PendingEntry) -> Literal["move", "dead", "leave"]:
        if entry.idle_ms < self.min_idle_ms:
            return "leave"  # fresh: the owner may still be working on it
        if max(entry.deliveries, self.worn.get(entry.id, 0)) >= self.max_deliveries:
            return "dead"
        return "move"


def entry_rules(
    assessment: GroupAssessment, limits: Limits, attempts: Mapping[EntryId, int] | None = None
) -> list[EntryRule]:
    """One rule per down consumer. `attempts`: recorded attempts of entries that have many."""
    worn = {entry: n for entry, n in (attempts or {}).items() if n >= limits.max_deliveries}
    return [
        EntryRule(consumer, assessment.min_idle_ms(consumer, limits), limits.max_deliveries, worn)
        for consumer in assessment.down
    ]


def plan_reclaims(
    assessment: GroupAssessment,
    entries: Iterable[PendingEntry],
    limits: Limits,
    attempts: Mapping[EntryId, int] | None = None,
) -> ReclaimPlan:
    """Apply the group's entry rules to `entries`: moves, dead letters, entries with no target.

    Entries of owners that are alive (or unknown) are left alone; the target is never an
    entry's owner, since owners here are down and targets are not. Dead letters carry the
    count that decided it (the larger of deliveries and recorded attempts).
    """
    rules = {rule.owner: rule for rule in entry_rules(assessment, limits, attempts)}
    has_target = assessment.target is not None
    moves: list[PendingEntry] = []
    dead: list[PendingEntry] = []
    stuck: list[PendingEntry] = []
    for entry in entries:
        rule = rules.get(entry.consumer)
        if rule is None:
            continue
        decision = rule.decide(entry)
        if decision == "dead":
            dead.append(
                entry._replace(deliveries=max(entry.deliveries, rule.worn.get(entry.id, 0)))
            )
        elif decision == "move":
            (moves if has_target else stuck).append(entry)
    return ReclaimPlan(assessment, tuple(moves), tuple(dead), tuple(stuck))
