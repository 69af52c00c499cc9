"""The conductor's side of publishing and dead-lettering, as agents meet it (protocol 2): a done
entry's outputs are handed to whoever holds it, a dead letter is asked of the conductor and
granted only to the holder of a worn-out or vanished entry, and outputs found nowhere void the
completion so the entry runs again. Real Redis, real PostgreSQL, a real conductor (max
deliveries 2); the reports are sent as an agent would."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent import Entry, staging
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import (
    AGENT,
    ME,
    G,
    S,
    assignment,
    back_to_me,
    delivered_to_me,
    drained,
    old_owner,
    post,
    published,
    running,
    work_events,
)


def asked(entry_id: str, consumer: str = ME, reason: str = "max-deliveries") -> dict[str, str]:
    return {
        "type": "DEAD_LETTER",
        "agentId": AGENT,
        "consumer": consumer,
        "stream": S,
        "group": G,
        "entryId": entry_id,
        "reason": reason,
    }


async def worn_out(redis: Redis, entry_id: str, times: int) -> None:
    """Deliver `entry_id` to ME `times` more times, as reads after crashes would."""
    for _ in range(times):
        await redis.xclaim(S, G, ME, 0, [entry_id])


async def test_a_dead_letter_is_asked_of_the_conductor_and_granted_to_the_holder_only(
    redis: Redis, engine: AsyncEngine, conductor: str
) -> None:
    entry_id = await delivered_to_me(conductor, redis, "rc-poison")

    # Not worn out yet (delivered once, the limit is 2): refused, nothing written.
    early = await post(conductor, **asked(entry_id))
    assert early.status_code == 409 and early.json()["detail"].startswith("refused:")
    assert "RIG_MAX_DELIVERIES" in early.json()["detail"]
    await worn_out(redis, entry_id, 1)
    # Another consumer, even of the same agent: refused.
    other = await post(conductor, **asked(entry_id, consumer=f"{AGENT}-other"))
    assert other.status_code == 409 and "does not hold" in other.json()["detail"]
    # Not gone from the stream: a `trimmed` dead letter is refused.
    trimmed = await post(conductor, **asked(entry_id, reason="trimmed"))
    assert trimmed.status_code == 409 and "still in" in trimmed.json()["detail"]
    assert await redis.xlen(f"{{{S}}}:dlq") == 0 and await redis.xlen(f"{S}:dlq") == 0

    granted = await post(conductor, **asked(entry_id))
    assert granted.status_code == 201, granted.text
    body = granted.json()
    assert (body["stream"], body["entryId"], body["deliveries"]) == (S, entry_id, 2)
    (letter,) = await redis.xrange(body["dlqStream"])
    assert letter[0] == body["dlqId"]
    assert letter[1]["originalId"] == entry_id and letter[1]["consumer"] == ME
    assert letter[1]["reason"] == "max-deliveries" and letter[1]["issueId"] == "rc-poison"
    assert await redis.xpending(S, G) == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }
    state = await assignment(engine, entry_id)
    assert state is not None and state[0] == "dead"


async def test_a_done_entry_is_published_not_dead_lettered(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    """Accepted with outputs, its agent gone before renaming, delivered again and again: the
    runtime that holds it worn out asks for a dead letter, is told it is done with its outputs,
    publishes them and acks. No dead letter."""
    final = tmp_path / "rc-done.json"
    entry_id = await delivered_to_me(conductor, redis, "rc-done")
    report = await old_owner(redis, entry_id)
    assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": 1}
    tmp = staging.temp_path(final, entry_id=entry_id, attempt=1)
    tmp.write_text("accepted")
    outputs = [{"staged": str(tmp), "path": str(final)}]
    done = await post(conductor, type="WORK_COMPLETED", attempt=1, outputs=outputs, **report)
    assert done.status_code == 202
    await back_to_me(redis, entry_id)
    await worn_out(redis, entry_id, 3)

    handled: list[str] = []
    async with running(lambda entry: handled.append(entry.id), settings()):
        await wait_for(lambda: drained(redis))
    assert handled == []
    assert final.read_text() == "accepted" and not tmp.exists()
    assert await published(engine, entry_id) is True
    assert await redis.exists(f"{S}:dlq", f"{{{S}}}:dlq") == 0


async def test_outputs_found_nowhere_void_the_completion_and_the_entry_runs_again(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    """The accepted attempt staged its file on a disk that went with its pod: the holder finds
    neither the staged file nor the path. The completion does not count: the holder reports
    the outputs missing, takes the next attempt and runs the handler, whose file is published."""
    final = tmp_path / "rc-lost.json"
    entry_id = await delivered_to_me(conductor, redis, "rc-lost")
    report = await old_owner(redis, entry_id)
    assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": 1}
    gone = staging.temp_path(final, entry_id=entry_id, attempt=1)  # never written here
    outputs = [{"staged": str(gone), "path": str(final)}]
    done = await post(conductor, type="WORK_COMPLETED", attempt=1, outputs=outputs, **report)
    assert done.status_code == 202
    await back_to_me(redis, entry_id)

    def handle(entry: Entry) -> None:
        entry.stage(final).write_text(f"attempt {entry.attempt}")

    async with running(handle, settings()):
        await wait_for(lambda: drained(redis))
    assert final.read_text() == "attempt 2"
    assert await assignment(engine, entry_id) == ("done", 2)
    assert await published(engine, entry_id) is True
    kinds = [
        (kind, attempt, detail) for kind, attempt, _, detail in await work_events(engine, entry_id)
    ]
    assert [(k, a) for k, a, _ in kinds] == [
        ("WORK_STARTED", 1),
        ("WORK_COMPLETED", 1),
        ("WORK_STARTED", None),  # fenced: done; the answer carries the outputs
        ("WORK_PUBLISHED", 1),
        ("WORK_STARTED", 2),
        ("WORK_COMPLETED", 2),
        ("WORK_PUBLISHED", 2),
    ]
    assert kinds[3][2] == {"missing": [str(final)]}
