"""Requested scans coalesce (`reaper.coalesce.Lane`): the requests that arrive before a queued
run starts share it, runs never overlap, and each request gets a run that started after it
arrived. Driven by events, not by time."""

from __future__ import annotations

import asyncio

from rig_conductor.reaper.coalesce import Lane


class Runs:
    """A run that waits for the test to let it finish; counts what ran and what overlapped."""

    def __init__(self) -> None:
        self.started: list[bool] = []  # each run's `remember`
        self.running = 0
        self.overlapped = False
        self.release = asyncio.Event()

    async def __call__(self, remember: bool) -> int:
        self.started.append(remember)
        self.running += 1
        self.overlapped |= self.running > 1
        await self.release.wait()
        self.release.clear()
        self.running -= 1
        return len(self.started)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)  # a turn of the loop: every task that can run does


async def test_requests_while_a_run_is_in_progress_share_the_next_run() -> None:
    runs = Runs()
    lane = Lane(runs)
    first = [asyncio.create_task(lane.ask()) for _ in range(3)]  # before the run starts
    await settle()
    assert runs.started == [True]  # one run for the three
    later = [asyncio.create_task(lane.ask(remember=n == 2)) for n in range(5)]
    await settle()
    assert runs.started == [True]  # queued behind the one in progress, not beside it
    runs.release.set()
    assert await asyncio.gather(*first) == [1, 1, 1]
    await settle()
    assert runs.started == [True, True]  # one run for the five; one of them asked to remember
    runs.release.set()
    assert await asyncio.gather(*later) == [2] * 5
    assert not runs.overlapped


async def test_a_requester_that_gives_up_does_not_cancel_the_shared_run() -> None:
    runs = Runs()
    lane = Lane(runs)
    quitter = asyncio.create_task(lane.ask())
    stayer = asyncio.create_task(lane.ask(remember=False))
    await settle()
    quitter.cancel()
    await settle()
    runs.release.set()
    assert await stayer == 1
    await lane.wait()


async def test_a_failed_run_fails_its_requesters_and_the_next_run_goes_on() -> None:
    calls: list[bool] = []

    async def run(remember: bool) -> str:
        calls.append(remember)
        if len(calls) == 1:
            raise RuntimeError("Redis went away")
        return "ok"

    lane: Lane[str] = Lane(run)
    failed = await asyncio.gather(lane.ask(), lane.ask(), return_exceptions=True)
    assert [type(f) for f in failed] == [RuntimeError, RuntimeError]
    assert await lane.ask() == "ok"
