"""The reclaim policy seen whole, for the tests: a plan for a group's entries in any order, and
its claims entry by entry. The reaper itself plans page by page (`reclaim.plan_pages`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from rig_conductor.domain import ConsumerName, PendingEntry
from rig_conductor.policy import reclaim


class Move(NamedTuple):
    entry: PendingEntry
    to: ConsumerName
    reason: reclaim.Reason


@dataclass(frozen=True, slots=True)
class Plan(reclaim.ReclaimPlan):
    @property
    def moves(self) -> tuple[Move, ...]:
        """The claims entry by entry, in order."""
        return tuple(
            Move(entry, claim.target, self.assessment.rules[claim.owner].reason)
            for claim in self.claims
            for entry in claim.entries
        )


def plan_reclaims(
    assessment: reclaim.GroupAssessment,
    entries: Iterable[PendingEntry],
    *,
    spread: reclaim.Spread | None = None,
) -> Plan:
    """`plan_pages` for `entries` of any owners, in any order."""
    by_owner: dict[ConsumerName, list[PendingEntry]] = {owner: [] for owner in assessment.rules}
    for entry in entries:
        found = by_owner.get(entry.consumer)
        if found is not None:
            found.append(entry)
    plan = reclaim.plan_pages(assessment, by_owner, spread=spread)
    return Plan(plan.assessment, plan.claims, plan.dead_letters, plan.no_target)
