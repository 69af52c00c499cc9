"""Staged-file intents read from Redis (`rig:staged:*`) are acted on only where the runtime
itself would have put the files: anyone who may write that key prefix must not make an agent
rename or delete a file of its choosing. Real Redis, real conductor, real files."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent import staging
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import (
    S,
    assignment,
    back_to_me,
    delivered_to_me,
    drained,
    old_owner,
    post,
    running,
)


def forged_pairs(tmp_path: Path, entry_id: str, attempt: int) -> list[list[str]]:
    """Pairs an attacker would write: victims as the temporary (unlinked on discard, renamed on
    commit) or as the final path, traversal, relative paths, another entry's temporary."""
    victim, target = tmp_path / "victim.txt", tmp_path / "target.txt"
    ours = str(staging.temp_path(target, entry_id=entry_id, attempt=attempt))
    return [
        [str(victim), str(target)],
        [ours, str(tmp_path / "sub" / ".." / "target.txt")],
        [ours.replace(entry_id, "1-0"), str(target)],
        [ours.replace(f".a{attempt}.", f".a{attempt + 1}."), str(target)],
        ["victim.txt", "target.txt"],
        [str(staging.temp_path(victim, entry_id=entry_id, attempt=attempt)), str(target)],
    ]


async def test_a_forged_intent_is_refused_logged_and_touches_no_file(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The accepted attempt's intent and an older one's are forged: the next runtime recovers
    the entry (acks it, as done) without renaming or unlinking anything they name."""
    entry_id = await delivered_to_me(conductor, redis, "rc-forged")
    report = await old_owner(redis, entry_id)
    for attempt in (1, 2):
        assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": attempt}
    assert (await post(conductor, type="WORK_COMPLETED", attempt=2, **report)).status_code == 202
    victims = {tmp_path / "victim.txt": "precious", tmp_path / "target.txt": "keep me"}
    victims[staging.temp_path(tmp_path / "victim.txt", entry_id=entry_id, attempt=2)] = "tmp"
    for path, text in victims.items():
        path.write_text(text)
    key = staging.intent_key(S, entry_id)
    for attempt in (1, 2):
        await redis.hset(key, str(attempt), json.dumps(forged_pairs(tmp_path, entry_id, attempt)))
    await redis.hset(key, "3", json.dumps({"not": "a list"}))

    handled: list[str] = []
    with caplog.at_level(logging.WARNING, logger="rig_conductor.agent.staging"):
        await back_to_me(redis, entry_id)
        async with running(lambda entry: handled.append(entry.id), settings()):
            await wait_for(lambda: drained(redis))
    assert handled == [] and await assignment(engine, entry_id) == ("done", 2)
    assert {path: path.read_text() for path in victims} == victims  # nothing renamed or removed
    refused = [r.getMessage() for r in caplog.records if "Refused staged intent" in r.getMessage()]
    assert len(refused) == 3 and all(entry_id in line for line in refused)


async def test_the_runtimes_own_intent_is_still_committed(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
) -> None:
    """The check refuses nothing `Staging.stage` records, names with spaces and dots included."""
    entry_id = await delivered_to_me(conductor, redis, "rc-own")
    report = await old_owner(redis, entry_id)
    assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": 1}
    area = staging.Staging(entry_id=entry_id, attempt=1)
    for name in ("out put.txt", ".hidden..txt", "x" * 240):
        area.stage(tmp_path / "deep" / name).write_text(name)
    files = area.close()
    await staging.record_intent(redis, stream=S, entry_id=entry_id, attempt=1, files=files)
    assert (await post(conductor, type="WORK_COMPLETED", attempt=1, **report)).status_code == 202
    await back_to_me(redis, entry_id)
    async with running(lambda entry: None, settings()):
        await wait_for(lambda: drained(redis))
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == sorted(
        ["out put.txt", ".hidden..txt", "x" * 240]
    )
