"""The moves of one group: pages of the owners' pending lists read, planned by the policy and
handed to the applier, with several pieces of work in flight at once.

The sweep is handed its three parts (`sweep_group`): the group's assessment (the policy's
rules, targets and spread), a `Reader` of pending pages (`PageReader`: `redis_sweep.read_pages`
on one client, timed) and the `Effects` each plan is handed to (the applier, through `apply`).
The acting owners are cut into chunks of about `CHUNK` entries a page. A chunk is one round trip
that reads the next page of each of its owners, the policy's plan for those entries
(`reclaim.plan_pages`, with the group's one `Spread`, so what earlier chunks gave each target
counts), and the applier's one round trip of guarded XCLAIMs (`effects.applier`, which logs and
records what moved meanwhile). As soon as a chunk's pages are read, the chunk of their next
pages is queued, so `LANES` lanes keep Redis busy with one chunk while this process plans
another. The cycle collector is paused for the sweep (`gcpolicy.paused`). Decides nothing
itself, and moves nothing itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from rig_conductor import gcpolicy
from rig_conductor.adapters.redis import sweep as redis_sweep
from rig_conductor.adapters.redis.sweep import Page, PageRequest
from rig_conductor.domain import ConsumerName, EntryId, GroupName, StreamKey
from rig_conductor.effects.journal import Timing, no_timing
from rig_conductor.policy import reclaim

# Chunks in flight: Redis claims one while this process plans the next and the pages of a third
# come in (with two, Redis idled while both were being planned).
LANES = 3
CHUNK = 16_000  # entries a chunk reads and claims at most: some 50 ms of Redis time
MAX_PAGE = 10_000  # entries per owner and read, when few owners make a chunk

Unit = dict[ConsumerName, PageRequest]


class Reader(Protocol):
    """Reads the next page of each owner's pending list in one group: `count` entries at most
    per owner; an owner whose list Redis refused is left out (`redis_sweep.read_pages`)."""

    async def __call__(
        self,
        *,
        stream: StreamKey,
        group: GroupName,
        pages: Mapping[ConsumerName, PageRequest],
        count: int,
    ) -> dict[ConsumerName, Page]: ...


class Effects(Protocol):
    """Where each plan goes (`effects.applier`): per claim of the plan, the ids that moved."""

    async def apply(self, plan: reclaim.ReclaimPlan) -> list[list[EntryId]]: ...


@dataclass(frozen=True, slots=True)
class PageReader:
    """The sweep's `Reader` on one client (where the stream lives), each round trip timed as
    the scan's `read` phase."""

    redis: Redis
    timing: Timing = no_timing

    async def __call__(
        self,
        *,
        stream: StreamKey,
        group: GroupName,
        pages: Mapping[ConsumerName, PageRequest],
        count: int,
    ) -> dict[ConsumerName, Page]:
        with self.timing("read"):
            return await redis_sweep.read_pages(
                self.redis, stream=stream, group=group, pages=pages, count=count
            )


async def sweep_group(
    assessment: reclaim.GroupAssessment,
    *,
    reader: Reader,
    effects: Effects,
    page_size: int | None = None,
) -> None:
    """Apply every owner rule of `assessment` to its owner's whole pending list, read page by
    page with `reader`, each chunk's plan handed to `effects`.

    The first failure ends the sweep once the work in flight is done, and is raised; what moved
    before it is with the effects (the applier's `flush` records it).
    """
    rules = assessment.rules
    if page_size is None:
        page_size = max(redis_sweep.PAGE, min(MAX_PAGE, CHUNK // max(1, len(rules))))
    sweep = _Sweep(assessment, reader, effects, page_size)
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
    def __init__(
        self,
        assessment: reclaim.GroupAssessment,
        reader: Reader,
        effects: Effects,
        page_size: int,
    ) -> None:
        self.assessment = assessment
        self.reader = reader
        self.effects = effects
        self.page_size = page_size
        self.spread = assessment.spread()
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
        assessment = self.assessment
        pages = await self.reader(
            stream=assessment.stream, group=assessment.group, pages=unit, count=self.page_size
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
        claimed = await self.effects.apply(plan)
        for claim, ids in zip(plan.claims, claimed, strict=True):
            self.spread.kept(claim.target, len(claim.entries) - len(ids))
