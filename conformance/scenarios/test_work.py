"""Work is finished once, whatever dies: an entry's handler runs once per attempt, its output is
published once, and an attempt that lost its entry publishes nothing."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from tests.projected_token import projected

from conformance.kit import GROUP, WITHIN, A, B, Opener

pytestmark = pytest.mark.timeout(240)


async def test_work_is_finished_once(world: Opener) -> None:
    async with world() as w:
        agent = w.start(A)
        await w.ready(agent)
        entries = {issue: await w.dispatch(issue) for issue in ("rc-1", "rc-2", "rc-3")}
        await w.until(lambda: w.finished(*entries.values()))
        assert w.stop_all() == {A: 0}, w.tails()
    for issue, entry_id in entries.items():
        assert w.calls(issue) == [f"{A}.a1"]
        assert w.effect(issue) == {
            "issueId": issue,
            "entryId": entry_id,
            "consumer": A,
            "attempt": 1,
        }
        reports = await w.reports(entry_id)
        kinds = [r.kind for r in reports]
        assert kinds == ["WORK_STARTED", "WORK_COMPLETED", "WORK_PUBLISHED"], reports
        assert {(r.consumer, r.attempt, r.group, r.fenced) for r in reports} == {
            (A, 1, GROUP, False)
        }
    assert await w.pending() == {}
    assert w.staged_leftovers() == []
    # A clean stop gives the consumer name back.
    assert not await w.lease_held(A)


async def test_a_sigkill_mid_entry_loses_nothing(world: Opener) -> None:
    async with world() as w:
        victim = w.start(A)
        await w.ready(victim)
        done = await w.dispatch("rc-1")
        await w.until(lambda: w.finished(done))
        held = await w.dispatch("rc-2", {"hold": [A]})
        await w.until(lambda: w.holding("rc-2", A))
        waiting = await w.dispatch("rc-3")
        victim.kill()  # mid-entry: nothing completed, nothing acknowledged, heartbeats stop
        rescuer = w.start(B)
        await w.until(lambda: w.finished(held, waiting))
        assert w.stop_all()[B] == 0, w.tails()
    # The finished entry never ran again; the one in hand ran once more, elsewhere, as a new
    # attempt; the waiting one ran once.
    assert w.calls("rc-1") == [f"{A}.a1"]
    (later,) = await w.completed(held)
    assert later.consumer == rescuer.consumer and later.attempt > 1
    assert w.calls("rc-2") == sorted([f"{A}.a1", f"{B}.a{later.attempt}"])
    assert w.effect("rc-2") == {
        "issueId": "rc-2",
        "entryId": held,
        "consumer": B,
        "attempt": later.attempt,
    }
    assert len(await w.completed(waiting)) == 1 and len(w.calls("rc-3")) == 1
    assert len(await w.completed(done)) == 1
    assert await w.pending() == {}


async def test_a_stale_completion_is_fenced_and_never_published(world: Opener) -> None:
    """A paused process (a long GC pause, a frozen node) loses its entry to the reaper; when
    it wakes and completes, its completion is refused and its output never reaches the path."""
    async with world() as w:
        sleeper = w.start(A)
        await w.ready(sleeper)
        entry_id = await w.dispatch("rc-1", {"hold": [A]})
        await w.until(lambda: w.holding("rc-1", A))
        rescuer = w.start(B)
        await w.ready(rescuer)
        sleeper.process.send_signal(signal.SIGSTOP)
        await w.until(lambda: w.finished(entry_id))
        published = w.effect("rc-1")
        assert published is not None and published["consumer"] == B
        w.release("rc-1")
        sleeper.process.send_signal(signal.SIGCONT)

        async def refused() -> bool:
            return any(
                r.kind == "WORK_COMPLETED" and r.consumer == A and r.fenced
                for r in await w.reports(entry_id)
            )

        await w.until(refused)
        await asyncio.sleep(2)  # whatever the sleeper does after the refusal, it has done by now
        codes = w.stop_all()
    assert codes == {A: 0, B: 0}, w.tails()
    assert w.effect("rc-1") == published
    assert w.staged_leftovers() == []
    (accepted,) = await w.completed(entry_id)
    assert accepted.consumer == B
    assert w.calls("rc-1") == sorted([f"{A}.a1", f"{B}.a{accepted.attempt}"])


async def test_a_rotated_token_file_is_read_again(world: Opener, tmp_path: Path) -> None:
    """The kubelet rotates a projected token by swapping the volume's `..data` link: the path
    stays, the file behind it changes. The conductor takes only the current token."""
    current = "conformance-current-token-0002"
    volume = tmp_path / "token-volume"
    path = projected(volume, "conformance-expired-token-0001\n", 1)
    auth = {"Authorization": f"Bearer {current}"}
    async with world(RIG_API_TOKENS=current, RIG_ALLOW_ANONYMOUS="false") as w:
        agent = w.start(A, RIG_API_TOKEN_FILE=str(path))
        await asyncio.sleep(3)  # heartbeats with the expired token, every one refused
        assert not await w.heard_from(A, **auth)
        projected(volume, current + "\n", 2)
        await w.until(lambda: w.heard_from(A, **auth))
        async with httpx.AsyncClient(base_url=w.url, headers=auth) as api:
            answer = await api.post(
                "/api/events",
                json={
                    "type": "ISSUE_ASSIGNED",
                    "issueId": "rc-1",
                    "agentId": "conf",
                    "payload": {},
                },
            )
        assert answer.status_code == 201, answer.text
        entry_id = answer.json()["entryId"]
        await w.until(lambda: w.finished(entry_id), within=WITHIN)
        assert w.stop_all() == {A: 0}, w.tails()
    assert agent.process.returncode == 0
    assert w.calls("rc-1") == [f"{A}.a1"]
