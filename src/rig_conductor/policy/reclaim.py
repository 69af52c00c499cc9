"""The reclaim decision for one consumer group: reaper rules 3 to 7 (docs/rules.md).

Pure: stdlib and domain only. Three parts:
1. `assess_group` judges every consumer that holds entries, from XINFO and the fleet's evidence
   alone: down (rule 3), degraded-stale (3b), or alive with entries that may have stalled (4b).
   Each owner it acts on gets an `OwnerRule`; every eligible target is ranked (rule 5).
2. `OwnerRule.partition` splits an owner's pending entries: move, dead-letter or leave (rules
   4, 4b, 7).
3. `Spread` water-fills the entries to move across the targets by their pending counts,
   counting what the scan already gave each (rule 5, docs/rules.md): spread, do not pile.

`plan_pages` applies all three to pending entries, owner by owner, and cuts the moves into
claims: the reaper calls it on the pages of the owners' pending lists it reads, with one
`Spread` for the whole scan of the group. `plan_by_hand` is an operator's move: the same owner
rules, one chosen target.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, NamedTuple, TypeVar

from rig_conductor.domain import (
    AgentId,
    ConsumerName,
    EntryId,
    GroupInfo,
    GroupName,
    PendingEntry,
    Progress,
    StreamKey,
)
from rig_conductor.policy.liveness import DownReason, Fleet, TargetCandidate

Reason = Literal["pod-gone", "down", "degraded", "stalled", "manual"]
PoolKey = tuple[bool, ConsumerName]  # (healthy targets only, the owner left out or "")
T = TypeVar("T")
# The order in which a move's reason is named: the first that applies.
REASONS: tuple[Reason, ...] = ("pod-gone", "down", "degraded", "stalled", "manual")


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """Rules 4, 4b and 7 (docs/rules.md) for the entries of one owner.

    An entry qualifies when it is `due` (its attempt made no progress within the deadline), or
    when it is idle at least `min_idle_ms` and not in `keep` (its attempt made progress lately).
    A qualifying entry is worn out when its delivery count, or its recorded attempts (`worn`:
    only entries with that many), reached `max_deliveries`. Worn entries are dead-lettered; the
    others move, to a non-degraded target only when `healthy_only`. An entry whose completion
    was accepted with outputs not yet published (`finished`) is never worn out: it moves, so
    that its next holder publishes them and acks it.
    """

    owner: ConsumerName
    agent: AgentId | None
    reason: Reason
    min_idle_ms: int
    max_deliveries: int
    worn: Mapping[EntryId, int] = field(default_factory=dict)
    healthy_only: bool = False
    keep: frozenset[EntryId] = frozenset()
    due: frozenset[EntryId] = frozenset()
    finished: frozenset[EntryId] = frozenset()
    # For the event log: why the owner is down, and its newest heartbeat.
    down_reasons: tuple[DownReason, ...] = ()
    last_heartbeat_at: datetime | None = None

    def partition(
        self, entries: Iterable[PendingEntry]
    ) -> tuple[list[PendingEntry], list[PendingEntry]]:
        """The owner's `entries` that move, and those worn out (each with the count that
        decided it); the others stay: fresh, the owner may still be working on them. One pass
        over a page, as the scan reads them."""
        due, keep, worn, finished = self.due, self.keep, self.worn, self.finished
        if not (due or keep or worn or finished):
            return self._partition_by_count(entries)
        min_idle, max_deliveries = self.min_idle_ms, self.max_deliveries
        move: list[PendingEntry] = []
        dead: list[PendingEntry] = []
        for entry in entries:
            if entry.id not in due and (entry.idle_ms < min_idle or entry.id in keep):
                continue
            count = max(entry.deliveries, worn.get(entry.id, 0)) if worn else entry.deliveries
            if count >= max_deliveries and entry.id not in finished:
                dead.append(entry._replace(deliveries=count))
            else:
                move.append(entry)
        return move, dead

    def _partition_by_count(
        self, entries: Iterable[PendingEntry]
    ) -> tuple[list[PendingEntry], list[PendingEntry]]:
        """`partition` for an owner without per-entry evidence (a down owner): its idle time and
        delivery count decide. Two passes in comprehensions, not a loop: a page of a thousand
        entries is partitioned for every thousand a scan moves."""
        page = entries if isinstance(entries, Sequence) else list(entries)
        min_idle, max_deliveries = self.min_idle_ms, self.max_deliveries
        dead = [e for e in page if e.deliveries >= max_deliveries and e.idle_ms >= min_idle]
        if dead:
            move = [e for e in page if e.deliveries < max_deliveries and e.idle_ms >= min_idle]
        else:
            move = [e for e in page if e.idle_ms >= min_idle]
        return move, dead

    @property
    def read_idle_ms(self) -> int:
        """The least idle time an entry of this owner needs to qualify at all: the filter its
        pending list is read with (every entry when some are due whatever their idle time)."""
        return 0 if self.due else self.min_idle_ms


@dataclass(frozen=True, slots=True)
class GroupAssessment:
    stream: StreamKey
    group: GroupName
    # One rule per owner the scan acts on, in the order the reasons rank.
    rules: Mapping[ConsumerName, OwnerRule]
    # Every consumer rule 5 (docs/rules.md) allows as a target, best first.
    targets: tuple[TargetCandidate, ...]
    # Degraded-stale owners left in place for want of a non-degraded target: their pending
    # counts (rule 3b's `degradedHeld`).
    left_degraded: Mapping[ConsumerName, int] = field(default_factory=dict)

    @property
    def down(self) -> dict[ConsumerName, OwnerRule]:
        """The rules of owners that are down by rule 3 (docs/rules.md)."""
        return {c: r for c, r in self.rules.items() if r.reason in ("pod-gone", "down")}

    def spread(self) -> Spread:
        return Spread(self.targets)


def assess_group(
    group: GroupInfo,
    fleet: Fleet,
    *,
    attempts: Mapping[EntryId, int] | None = None,
    progress: Progress | None = None,
    finished: frozenset[EntryId] = frozenset(),
) -> GroupAssessment:
    """Judge every consumer of `group` that holds entries; `attempts`: recorded attempts of
    entries that have many; `progress`: rule 4b's evidence (None: every entry by idle time);
    `finished`: entries whose accepted outputs are not published yet (never dead-lettered)."""
    limits = fleet.limits
    worn = {e: n for e, n in (attempts or {}).items() if n >= limits.max_deliveries}
    progress = progress or Progress()
    stalls = _may_stall(group, fleet, progress)
    owners = [
        rule
        for info in group.consumers
        if info.pending
        and (rule := _owner_rule(info.name, fleet, worn, progress if stalls else None))
    ]
    if finished:
        owners = [replace(rule, finished=finished) for rule in owners]
    if not owners:  # the common case: nothing to move, no target to rank (a quiet group)
        return GroupAssessment(group.stream, group.name, {}, (), {})
    targets = rank_targets(group, fleet)
    has_healthy = any(not t.degraded for t in targets)
    pending = {info.name: info.pending for info in group.consumers if info.pending}
    rules: list[OwnerRule] = []
    left_degraded: dict[ConsumerName, int] = {}
    for rule in owners:
        if rule.reason == "degraded" and not has_healthy:
            left_degraded[rule.owner] = pending[rule.owner]
            continue
        rules.append(rule)
    rules.sort(key=lambda r: REASONS.index(r.reason))
    return GroupAssessment(
        group.stream, group.name, {r.owner: r for r in rules}, targets, left_degraded
    )


def rank_targets(
    group: GroupInfo, fleet: Fleet, *, besides: ConsumerName | None = None
) -> tuple[TargetCandidate, ...]:
    """The consumers of `group` (but `besides`) that rule 5 lets receive entries, best first."""
    return tuple(
        sorted(
            (
                t
                for info in group.consumers
                if info.name != besides
                and (t := fleet.target(info, stream=group.stream, group=group.name)) is not None
            ),
            key=TargetCandidate.rank,
        )
    )


# Redis stamps entry ids with its own clock, the evidence uses PostgreSQL's: allow this much skew.
CLOCK_SKEW_MS = 60_000


def _may_stall(group: GroupInfo, fleet: Fleet, progress: Progress) -> bool:
    """Whether any entry of `group` can be stalled (rule 4b), so alive owners' lists need a look.

    An entry's idle time never exceeds its age, and its id carries the time it was added: when
    even the oldest pending entry is younger than the deadline, and no recorded attempt is past
    it, no entry can have stalled. This keeps a quiet scan from reading every pending list.
    """
    deadline = fleet.limits.entry_deadline_ms
    if deadline <= 0:
        return False
    if progress.stale:
        return True
    oldest = group.oldest_id_ms
    if oldest is None:
        return group.pending > 0
    now_ms = fleet.evidence.now.timestamp() * 1000
    return oldest <= now_ms - deadline + CLOCK_SKEW_MS


def _owner_rule(
    consumer: ConsumerName,
    fleet: Fleet,
    worn: Mapping[EntryId, int],
    progress: Progress | None,
) -> OwnerRule | None:
    """The owner's rule: down, degraded-stale, or (with `progress`: its group may hold stalled
    entries) alive and judged entry by entry; None when the scan leaves it alone."""
    limits = fleet.limits
    agent = fleet.agent_of(consumer)
    if fleet.is_down(consumer):
        verdict = fleet.owner(consumer)
        pod_gone = verdict.pod_gone
        return OwnerRule(
            consumer,
            agent,
            "pod-gone" if pod_gone else "down",
            # A pod Kubernetes reports gone can never ack: its entries qualify at any idle time.
            0 if pod_gone else limits.entry_stale_ms,
            limits.max_deliveries,
            worn,
            down_reasons=verdict.reasons,
            last_heartbeat_at=verdict.last_heartbeat_at,
        )
    if fleet.degraded_stale(consumer):
        # A degraded worker that retries its entries keeps resetting their idle time: all go.
        return OwnerRule(
            consumer, agent, "degraded", 0, limits.max_deliveries, worn, healthy_only=True
        )
    if progress is not None:
        return OwnerRule(
            consumer,
            agent,
            "stalled",
            limits.entry_deadline_ms,
            limits.max_deliveries,
            worn,
            keep=progress.fresh,
            due=progress.stale,
        )
    return None


class Spread:
    """Rule 5's water-filling: each entry goes to the eligible target holding the fewest pending
    entries of the group at that moment, counting what this scan already gave it; ties go to the
    freshest evidence. Non-degraded targets before degraded ones, whatever their load; never
    the entry's own owner."""

    def __init__(self, targets: Sequence[TargetCandidate]) -> None:
        self._targets = list(targets)  # best rank first
        self._load = {t.consumer: t.pending for t in targets}

    def pool(self, owner: ConsumerName, *, healthy_only: bool) -> list[TargetCandidate]:
        others = [t for t in self._targets if t.consumer != owner]
        healthy = [t for t in others if not t.degraded]
        return healthy if healthy or healthy_only else others

    def share(
        self, count: int, *, owner: ConsumerName, healthy_only: bool = False
    ) -> list[tuple[TargetCandidate, int]]:
        """How `count` entries of `owner` divide over the pool; empty when there is no target.
        Does not count them as given: call `took` with what is planned to move (`kept` takes
        back what the guard left)."""
        pool = self.pool(owner, healthy_only=healthy_only)
        if not pool or count <= 0:
            return []
        order = sorted(pool, key=lambda t: self._load[t.consumer])  # stable: rank within load
        level, remaining, filled = self._load[order[0].consumer], count, 0
        while True:
            while filled < len(order) and self._load[order[filled].consumer] <= level:
                filled += 1
            if filled == len(order):
                step, extra = divmod(remaining, filled)
                level += step
                break
            next_level = self._load[order[filled].consumer]
            cost = filled * (next_level - level)
            if cost > remaining:
                step, extra = divmod(remaining, filled)
                level += step
                break
            remaining -= cost
            level = next_level
        lucky = {t.consumer for t in sorted(order[:filled], key=TargetCandidate.rank)[:extra]}
        shares = [
            (t, level - self._load[t.consumer] + (t.consumer in lucky)) for t in order[:filled]
        ]
        return [(t, n) for t, n in sorted(shares, key=lambda s: s[0].rank()) if n > 0]

    def took(self, consumer: ConsumerName, count: int) -> None:
        """`count` more entries given to `consumer`."""
        if count < 0:
            raise ValueError(f"took {count} entries: what the guard left is `kept`")
        self._load[consumer] += count

    def kept(self, consumer: ConsumerName, count: int) -> None:
        """The guard left `count` of the entries planned for `consumer` where they were: it
        holds that many fewer than planned, and later pages may fill the room."""
        if count < 0:
            raise ValueError(f"kept {count} entries: a count of entries is never negative")
        self._load[consumer] -= count

    def pool_key(self, rule: OwnerRule) -> PoolKey:
        """Owners with the same key share one pool of targets: healthy-only or not, and the
        owner itself left out when it is a target too (an alive owner of stalled entries)."""
        excluded = rule.owner if rule.owner in self._load else ConsumerName("")
        return (rule.healthy_only, excluded)

    def assign(
        self, key: PoolKey, runs: Sequence[tuple[ConsumerName, Sequence[T]]]
    ) -> list[tuple[ConsumerName, ConsumerName, list[T]]]:
        """Water-fill the items of `runs` (owner, items) over the pool `key` as one lot, and
        cut them into contiguous stretches: one (owner, target, items) per stretch, counted as
        given. Filling per entry or per lot ends at the same loads; per lot, each owner's
        entries go to few targets, so a move is a few large XCLAIMs, not one per target.
        Empty when the pool has no target."""
        total = sum(len(items) for _, items in runs)
        shares = iter(self.share(total, owner=key[1], healthy_only=key[0]))
        stretches: list[tuple[ConsumerName, ConsumerName, list[T]]] = []
        target: TargetCandidate | None = None
        left = 0
        for owner, items in runs:
            start = 0
            while start < len(items):
                while left == 0:
                    found = next(shares, None)
                    if found is None:
                        return stretches
                    target, left = found
                assert target is not None
                take = min(left, len(items) - start)
                stretches.append((owner, target.consumer, list(items[start : start + take])))
                self.took(target.consumer, take)
                left -= take
                start += take
        return stretches


_IDLE_MS = operator.attrgetter("idle_ms")


class Claim(NamedTuple):
    """A stretch of one owner's entries for one target: one guarded XCLAIM. The guard is the
    least idle time seen among them, so an entry touched since it was read stays put."""

    owner: ConsumerName
    target: ConsumerName
    entries: Sequence[PendingEntry]

    @property
    def min_idle_ms(self) -> int:
        least: int = min(map(_IDLE_MS, self.entries))
        return least


@dataclass(frozen=True, slots=True)
class ReclaimPlan:
    """What to do with some pending entries of one group."""

    assessment: GroupAssessment
    claims: tuple[Claim, ...]
    # Worn out (rule 7), each with the count that decided it: the larger of deliveries and
    # recorded attempts.
    dead_letters: tuple[PendingEntry, ...]
    # Qualifying, but no target could take them: left in place.
    no_target: tuple[PendingEntry, ...]


def plan_pages(
    assessment: GroupAssessment,
    pages: Mapping[ConsumerName, Sequence[PendingEntry]],
    *,
    spread: Spread | None = None,
) -> ReclaimPlan:
    """Apply the group's owner rules to each owner's entries in `pages` and spread what moves
    over the targets, one lot per pool of targets, owners in the order of `pages` (the callers
    give them in rule order); the moves come as claims.

    `spread`: the group's spread so far in this scan (what earlier pages already gave each
    target counts); a fresh one when None. Owners without a rule are left alone. The cost is
    that of `pages`, not of every rule: a sweep plans a few owners at a time out of thousands.
    """
    rules = assessment.rules
    spread = spread if spread is not None else assessment.spread()
    dead: list[PendingEntry] = []
    pools: dict[PoolKey, list[tuple[ConsumerName, list[PendingEntry]]]] = {}
    for owner, page in pages.items():
        rule = rules.get(owner)
        if rule is None or not page:
            continue
        movable, worn = rule.partition(page)
        dead.extend(worn)
        if movable:
            pools.setdefault(spread.pool_key(rule), []).append((owner, movable))
    claims: list[Claim] = []
    stuck: list[PendingEntry] = []
    for key, runs in pools.items():
        stretches = spread.assign(key, runs)
        claims.extend(Claim(owner, target, items) for owner, target, items in stretches)
        if not stretches:
            stuck.extend(e for _, items in runs for e in items)
    return ReclaimPlan(assessment, tuple(claims), tuple(dead), tuple(stuck))


def plan_by_hand(
    assessment: GroupAssessment, entries: Sequence[PendingEntry], *, target: ConsumerName
) -> ReclaimPlan:
    """An operator's move of `entries` to `target` (the console): each owner's rule (reason
    `manual`) says which move and which are worn out (rule 7). Each entry that moves is a claim
    of its own, guarded by the idle time seen for it, so an entry touched since the operator's
    look stays where it is whatever the others' idle times."""
    claims: list[Claim] = []
    dead: list[PendingEntry] = []
    for owner, rule in assessment.rules.items():
        movable, worn = rule.partition([e for e in entries if e.consumer == owner])
        claims.extend(Claim(owner, target, (entry,)) for entry in movable)
        dead.extend(worn)
    return ReclaimPlan(assessment, tuple(claims), tuple(dead), ())
