"""The moves of one group: pages of the owners' pending lists read, planned by the policy and
claimed, with several pieces of work in flight at once.

The acting owners are cut into chunks of about `CHUNK` entries a page. A chunk is one round trip
that reads the next page of each of its owners (`redis_sweep.read_pages`), the policy's plan for
those entries (`reclaim.plan_pages`, with the group's one `Spread`, so what earlier chunks gave
each target counts), and one round trip of guarded XCLAIMs. As soon as a chunk's pages are read,
the chunk of their next pages is queued, so `LANES` lanes keep Redis busy with one chunk while
this process plans another. What moved goes to `on_moved` as it moves, so the caller logs and
records it meanwhile. The cycle collector is paused for the sweep (`gcpolicy.paused`). Decides
nothing itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from redis.asyncio import Redis

from rig_conductor import gcpolicy
from rig_conductor.adapters import redis_sweep
from rig_conductor.adapters.redis_sweep import PageRequest
from rig_conductor.domain import ConsumerName, EntryId, PendingEntry
from rig_conductor.policy import reclaim

# Chunks in flight: Redis claims one while this process plans the next and the pages of a third
# come in (with two, Redis idled while both were being planned).
LANES = 3
CHUNK = 16_000  # entries a chunk reads and claims at most: some 50 ms of Redis time
MAX_PAGE = 10_000  # entries per owner and read, when few owners make a chunk

Timing = Callable[[str], AbstractContextManager[None]]
# (owner, target, ids): entries that have just moved from owner to target.
Moved = Callable[[ConsumerName, ConsumerName, list[EntryId]], None]
Unit = dict[ConsumerName, PageRequest]


@dataclass
class GroupSweep:
    """What the moves of one group did (in a dry run: would do)."""

    # (owner, target) -> how many entries moved from one to the other (`on_moved` hears which).
    moved: dict[tuple[ConsumerName, ConsumerName], int] = field(default_factory=dict)
    # Qualifying entries worn out, with the count that decided it: for the dead-letter path.
    worn: list[PendingEntry] = field(default_factory=list)
    # Per owner, qualifying entries left in place because no target could take them.
    no_target: dict[ConsumerName, int] = field(default_factory=dict)
    # Entries chosen for a move but left by the guard: acked, re-read or trimmed meanwhile.
    skipped: int = 0

    @property
    def reclaimed(self) -> int:
        return sum(self.moved.values())


def _no_timing(phase: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


async def sweep_group(
    redis: Redis,
    assessment: reclaim.GroupAssessment,
    *,
    dry_run: bool,
    page_size: int | None = None,
    timing: Timing = _no_timing,
    on_moved: Moved | None = None,
) -> GroupSweep:
    """Apply every owner rule of `assessment` to its whole pending list.

    `timing(phase)` wraps the Redis work of each phase (`read`, `claim`) for the scan report;
    `on_moved` hears of every stretch of entries that moved (in a dry run: would move). The first
    failure ends the sweep once the work in flight is done, and is raised; what moved before
    it has been handed to `on_moved`.
    """
    rules = assessment.rules
    if page_size is None:
        page_size = max(redis_sweep.PAGE, min(MAX_PAGE, CHUNK // max(1, len(rules))))
    sweep = _Sweep(redis, assessment, dry_run, page_size, timing, on_moved)
    owners = list(rules)
    per_chunk = max(1, CHUNK // page_size)
    for start in range(0, len(owners), per_chunk):
        chunk = owners[start : start + per_chunk]
        sweep.work.put_nowait({o: PageRequest(rules[o].read_idle_ms, "-") for o in chunk})
    with gcpolicy.paused():  # a page's rows are freed by reference counting (`gcpolicy`)
        lanes = [asyncio.create_task(sweep.lane()) for _ in range(LANES)]
        try:
            await sweep.work.join()
        finally:
            for lane in lanes:
                lane.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
    if sweep.failures:
        raise sweep.failures[0]
    return sweep.result


class _Sweep:
    def __init__(
        self,
        redis: Redis,
        assessment: reclaim.GroupAssessment,
        dry_run: bool,
        page_size: int,
        timing: Timing,
        on_moved: Moved | None,
    ) -> None:
        self.redis = redis
        self.assessment = assessment
        self.dry_run = dry_run
        self.page_size = page_size
        self.timing = timing
        self.on_moved = on_moved
        self.spread = assessment.spread()
        self.result = GroupSweep()
        self.work: asyncio.Queue[Unit] = asyncio.Queue()
        self.failures: list[Exception] = []

    async def lane(self) -> None:
        while True:
            unit = await self.work.get()
            try:
                if not self.failures:
                    await self.step(unit)
            except Exception as exc:  # raised by sweep_group once the lanes are done
                self.failures.append(exc)
            finally:
                self.work.task_done()

    async def step(self, unit: Unit) -> None:
        """Read one chunk's pages, queue the chunk of their next pages, plan and claim."""
        stream, group = self.assessment.stream, self.assessment.group
        with self.timing("read"):
            pages = await redis_sweep.read_pages(
                self.redis, stream=stream, group=group, pages=unit, count=self.page_size
            )
        follow = {
            owner: PageRequest(unit[owner].min_idle_ms, page.next_start)
            for owner, page in pages.items()
            if page.next_start is not None
        }
        if follow:
            self.work.put_nowait(follow)
        entries = {owner: page.entries for owner, page in pages.items()}
        plan = reclaim.plan_pages(self.assessment, entries, spread=self.spread)
        result = self.result
        result.worn.extend(plan.dead_letters)
        for entry in plan.no_target:
            result.no_target[entry.consumer] = result.no_target.get(entry.consumer, 0) + 1
        batches = [
            redis_sweep.ClaimBatch(claim.target, claim.min_idle_ms, [e.id for e in claim.entries])
            for claim in plan.claims
        ]
        if self.dry_run:
            claimed = [list(batch.ids) for batch in batches]
        else:
            with self.timing("claim"):
                claimed = await redis_sweep.claim(
                    self.redis, stream=stream, group=group, batches=batches
                )
        for claim, batch, ids in zip(plan.claims, batches, claimed, strict=True):
            left = len(batch.ids) - len(ids)
            self.spread.took(claim.target, -left)  # the guard left these where they were
            result.skipped += left
            if ids:
                key = (claim.owner, claim.target)
                result.moved[key] = result.moved.get(key, 0) + len(ids)
                if self.on_moved is not None:
                    self.on_moved(claim.owner, claim.target, ids)
