"""The moves of one group: pages of the owners' pending lists read, planned by the policy and
handed to the applier, with several pieces of work in flight at once.

The acting owners are cut into chunks of about `CHUNK` entries a page. A chunk is one round trip
that reads the next page of each of its owners (`redis_sweep.read_pages`), the policy's plan for
those entries (`reclaim.plan_pages`, with the group's one `Spread`, so what earlier chunks gave
each target counts), and the applier's one round trip of guarded XCLAIMs (`effects.applier`,
which logs and records what moved meanwhile). As soon as a chunk's pages are read, the chunk of
their next pages is queued, so `LANES` lanes keep Redis busy with one chunk while this process
plans another. The cycle collector is paused for the sweep (`gcpolicy.paused`). Decides nothing
itself, and moves nothing itself.
"""

from __future__ import annotations

import asyncio

from rig_conductor import gcpolicy
from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.adapters.redis.sweep import PageRequest
from rig_conductor.domain import ConsumerName
from rig_conductor.effects import applier as effects
from rig_conductor.policy import reclaim

# Chunks in flight: Redis claims one while this process plans the next and the pages of a third
# come in (with two, Redis idled while both were being planned).
LANES = 3
CHUNK = 16_000  # entries a chunk reads and claims at most: some 50 ms of Redis time
MAX_PAGE = 10_000  # entries per owner and read, when few owners make a chunk

Unit = dict[ConsumerName, PageRequest]


async def sweep_group(applier: effects.Applier, *, page_size: int | None = None) -> None:
    """Apply every owner rule of the applier's group to its whole pending list, read with the
    applier's client; the applier's `timing` also times the reads (`read`).

    The first failure ends the sweep once the work in flight is done, and is raised; what moved
    before it is with the applier (`flush` records it).
    """
    rules = applier.assessment.rules
    if page_size is None:
        page_size = max(redis_sweep.PAGE, min(MAX_PAGE, CHUNK // max(1, len(rules))))
    sweep = _Sweep(applier, page_size)
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


class _Sweep:
    def __init__(self, applier: effects.Applier, page_size: int) -> None:
        self.applier = applier
        self.page_size = page_size
        self.spread = applier.assessment.spread()
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
        """Read one chunk's pages, queue the chunk of their next pages, plan and apply."""
        applier = self.applier
        assessment = applier.assessment
        with applier.timing("read"):
            pages = await redis_sweep.read_pages(
                applier.redis,
                stream=assessment.stream,
                group=assessment.group,
                pages=unit,
                count=self.page_size,
            )
        follow = {
            owner: PageRequest(unit[owner].min_idle_ms, page.next_start)
            for owner, page in pages.items()
            if page.next_start is not None
        }
        if follow:
            self.work.put_nowait(follow)
        entries = {owner: page.entries for owner, page in pages.items()}
        plan = reclaim.plan_pages(assessment, entries, spread=self.spread)
        claimed = await applier.apply(plan)
        for claim, ids in zip(plan.claims, claimed, strict=True):
            self.spread.kept(claim.target, len(claim.entries) - len(ids))
