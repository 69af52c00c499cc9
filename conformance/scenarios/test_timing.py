"""The timing rules: progress keeps a long entry, a hung handler is given up at its deadline,
a degraded agent reads nothing until its pause ends, SIGTERM finishes the entry in hand."""

from __future__ import annotations

import asyncio

import pytest

from conformance.kit import A, B, Opener

pytestmark = pytest.mark.timeout(240)


async def test_progress_keeps_a_long_entry(world: Opener) -> None:
    """Work three times as long as the deadline, reporting progress: nobody takes it away."""
    deadline = {"RIG_ENTRY_DEADLINE_MS": "2000"}
    async with world(**deadline) as w:
        worker = w.start(A, **deadline)
        await w.ready(worker)
        entry_id = await w.dispatch("rc-1", {"workS": 6, "progressS": 0.3})
        bystander = w.start(B, **deadline)  # a live target, were the entry taken away
        await w.ready(bystander)
        await w.until(lambda: w.finished(entry_id))
        assert w.stop_all() == {A: 0, B: 0}, w.tails()
    assert w.calls("rc-1") == [f"{A}.a1"]
    reports = await w.reports(entry_id)
    assert not any(r.fenced for r in reports), reports
    progress = [r for r in reports if r.kind == "WORK_PROGRESS"]
    assert len(progress) >= 10 and {(r.consumer, r.attempt) for r in progress} == {(A, 1)}
    assert (w.effect("rc-1") or {}).get("consumer") == A


async def test_a_hung_handler_is_abandoned_at_the_deadline(world: Opener) -> None:
    """The agent gives the entry up (WORK_FAILED) and reads on; the reaper moves the entry; the
    agent never runs it again, and the hung call's late result is never published."""
    async with world(RIG_ENTRY_DEADLINE_MS="4000") as w:
        hung = w.start(A, RIG_ENTRY_DEADLINE_MS="2000")
        await w.ready(hung)
        entry_id = await w.dispatch("rc-1", {"hold": [A]})
        await w.until(lambda: w.holding("rc-1", A))
        rescuer = w.start(B)
        await w.ready(rescuer)

        async def given_up() -> bool:
            return any(
                (r.kind, r.consumer, r.attempt) == ("WORK_FAILED", A, 1)
                for r in await w.reports(entry_id)
            )

        await w.until(given_up)
        await w.until(lambda: w.finished(entry_id))
        assert rescuer.stop() == 0, w.tails()
        # The agent reads on while its hung call still runs.
        later = await w.dispatch("rc-2")
        await w.until(lambda: w.finished(later))
        w.release("rc-1")  # the hung call ends at last: too late to count
        await asyncio.sleep(2)  # whatever the agent does with its late result, it has done by now
        assert w.stop_all()[A] == 0, w.tails()
    (moved,) = await w.completed(entry_id)
    assert moved.consumer == B and moved.attempt > 1
    assert w.calls("rc-1") == sorted([f"{A}.a1", f"{B}.a{moved.attempt}"])
    assert (w.effect("rc-1") or {}).get("consumer") == B
    assert w.calls("rc-2") == [f"{A}.a1"]
    assert w.staged_leftovers() == []


async def test_degraded_pauses_reading_and_the_entries_move(world: Opener) -> None:
    async with world(RIG_DEGRADED_GRACE_MS="1000") as w:
        degraded = w.start(A)
        await w.ready(degraded)
        held = await w.dispatch("rc-1", {"degraded": [A], "pauseS": 60})
        await w.until(lambda: w.flagged(A, "conformance_degraded"))
        waiting = await w.dispatch("rc-2")
        await asyncio.sleep(4)  # several of its read periods: it reads nothing, not even rc-2
        assert w.calls("rc-2") == []
        assert await w.pending() == {held: A}
        healthy = w.start(B)
        await w.until(lambda: w.finished(held, waiting))
        assert w.stop_all() == {A: 0, B: 0}, w.tails()
    assert w.calls("rc-1") == sorted([f"{A}.a1", f"{B}.a2"])
    assert w.calls("rc-2") == [f"{healthy.consumer}.a1"]
    (failed,) = [r for r in await w.reports(held) if r.kind == "WORK_FAILED"]
    assert (failed.consumer, failed.attempt) == (A, 1)


async def test_sigterm_finishes_the_entry_in_hand_and_exits_0(world: Opener) -> None:
    async with world() as w:
        agent = w.start(A)
        await w.ready(agent)
        in_hand = await w.dispatch("rc-1", {"hold": [A]})
        await w.until(lambda: w.holding("rc-1", A))
        agent.terminate()
        later = await w.dispatch("rc-2")
        await asyncio.sleep(1)  # time to exit, which it must not do with an entry in hand
        assert agent.process.poll() is None, "it exited with an entry in hand"
        w.release("rc-1")
        assert agent.stop() == 0, w.tails()
        assert not await w.lease_held(A)
        assert await w.finished(in_hand)
        # Stopping, it read nothing new: rc-2 is there for the next agent.
        assert w.calls("rc-2") == []
        successor = w.start(B)
        await w.until(lambda: w.finished(later))
        assert successor.stop() == 0, w.tails()
    assert w.calls("rc-1") == [f"{A}.a1"]
    assert (w.effect("rc-1") or {}).get("consumer") == A
    assert w.calls("rc-2") == [f"{B}.a1"]
