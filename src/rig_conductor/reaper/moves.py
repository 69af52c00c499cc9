"""The moves of one group: owner rules applied in Redis page by page, spread, then claimed.

Each round sorts the next page of every acting owner's pending list in one round trip
(`redis_sweep.sweep_pages`), lets the policy's `Spread` divide what may move among the
targets, one lot per pool of targets, and claims each stretch of an owner's entries for a
target with one guarded XCLAIM, all in a second round trip. The spread counts each share as
soon as it is given, and takes back what the guard left in place, so an entry that did not
move does not weigh on its target. Decides nothing itself:
the rules and the spread are `policy.reclaim`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from redis.asyncio import Redis

from rig_conductor.adapters import redis_sweep
from rig_conductor.domain import ConsumerName, EntryId, PendingEntry
from rig_conductor.policy import reclaim


@dataclass
class GroupSweep:
    """What the moves of one group did (in a dry run: would do)."""

    # (owner, target) -> the entries moved from one to the other, in the order they moved.
    moved: dict[tuple[ConsumerName, ConsumerName], list[EntryId]] = field(default_factory=dict)
    # Qualifying entries worn out, with the count that decided it: for the dead-letter path.
    worn: list[PendingEntry] = field(default_factory=list)
    # Per owner, qualifying entries left in place because no target could take them.
    no_target: dict[ConsumerName, int] = field(default_factory=dict)
    # Entries chosen for a move but left by the guard: acked, re-read or trimmed meanwhile.
    skipped: int = 0

    @property
    def reclaimed(self) -> int:
        return sum(len(ids) for ids in self.moved.values())


def _claims(
    pages: dict[ConsumerName, redis_sweep.SweptPage],
    rules: Mapping[ConsumerName, reclaim.OwnerRule],
    spread: reclaim.Spread,
    result: GroupSweep,
) -> tuple[list[ConsumerName], list[redis_sweep.ClaimBatch]]:
    """One round's XCLAIMs: the pages' movable entries spread one lot per pool of targets, a
    batch per stretch of one owner's entries for one target. Worn entries and entries without
    a target are noted in `result`."""
    owners: list[ConsumerName] = []
    batches: list[redis_sweep.ClaimBatch] = []
    pools: dict[reclaim.PoolKey, list[tuple[ConsumerName, list[EntryId]]]] = {}
    for owner, page in pages.items():
        rule = rules[owner]
        result.worn.extend(e._replace(deliveries=rule.deliveries(e)) for e in page.worn)
        if page.movable:
            pools.setdefault(spread.pool_key(rule), []).append((owner, page.movable))
    for key, runs in pools.items():
        stretches = spread.assign(key, runs)
        if not stretches:
            for owner, ids in runs:
                result.no_target[owner] = result.no_target.get(owner, 0) + len(ids)
        for owner, target, ids in stretches:
            least = pages[owner].least_idle_ms  # the guard: the least idle this page saw
            batches.append(redis_sweep.ClaimBatch(target, least, ids))
            owners.append(owner)
    return owners, batches


def sweep_rule(rule: reclaim.OwnerRule) -> redis_sweep.SweepRule:
    return redis_sweep.SweepRule(
        rule.owner,
        rule.min_idle_ms,
        rule.max_deliveries,
        tuple(rule.worn),
        tuple(rule.keep),
        tuple(rule.due),
    )


async def sweep_group(
    redis: Redis,
    assessment: reclaim.GroupAssessment,
    *,
    dry_run: bool,
    page_size: int = redis_sweep.SWEEP_PAGE,
) -> GroupSweep:
    """Apply every owner rule of `assessment` to its whole pending list."""
    stream, group = assessment.stream, assessment.group
    rules = assessment.rules
    spread = assessment.spread()
    result = GroupSweep()
    cursors = {owner: (sweep_rule(rule), "-") for owner, rule in rules.items()}
    while cursors:
        pages = await redis_sweep.sweep_pages(
            redis, stream=stream, group=group, pages=cursors, page_size=page_size
        )
        owners, batches = _claims(pages, rules, spread, result)
        if dry_run:
            claimed = [list(batch.ids) for batch in batches]
        else:
            claimed = await redis_sweep.claim(redis, stream=stream, group=group, batches=batches)
        for owner, batch, ids in zip(owners, batches, claimed, strict=True):
            left = len(batch.ids) - len(ids)
            spread.took(batch.target, -left)  # the guard left these where they were
            result.skipped += left
            if ids:
                result.moved.setdefault((owner, batch.target), []).extend(ids)
        cursors = {
            owner: (cursors[owner][0], page.next_start)
            for owner, page in pages.items()
            if page.next_start is not None
        }
    return result
