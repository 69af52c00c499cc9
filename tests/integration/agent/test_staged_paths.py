"""Recorded outputs steer a rename, so they are checked where they enter: the conductor takes a
WORK_COMPLETED's outputs only where the runtime itself would have staged them for that entry
and attempt (`422` naming `outputs` otherwise, nothing recorded), and the runtime renames
nothing it is told to publish that is not such a temporary. Real Redis, real conductor, real
files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent import staging
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import (
    assignment,
    back_to_me,
    delivered_to_me,
    drained,
    old_owner,
    post,
    published,
    running,
)


def forged_pairs(tmp_path: Path, entry_id: str, attempt: int) -> list[list[str]]:
    """Pairs an attacker would send: victims as the temporary (renamed on publish) or as the
    final path, traversal, relative paths, another entry's or attempt's temporary."""
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


async def test_forged_outputs_are_refused_and_nothing_is_recorded(
    redis: Redis, engine: AsyncEngine, conductor: str, tmp_path: Path
) -> None:
    entry_id = await delivered_to_me(conductor, redis, "rc-forged")
    report = await old_owner(redis, entry_id)
    assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": 1}
    for staged, path in forged_pairs(tmp_path, entry_id, 1):
        answer = await post(
            conductor,
            type="WORK_COMPLETED",
            attempt=1,
            outputs=[{"staged": staged, "path": path}],
            **report,
        )
        assert answer.status_code == 422, (staged, path, answer.text)
        assert "outputs" in answer.text
    assert await assignment(engine, entry_id) == ("running", 1)


@pytest.mark.parametrize("name", ["out put.txt", ".hidden..txt", "x" * 240])
async def test_the_runtimes_own_outputs_are_published(
    redis: Redis,
    engine: AsyncEngine,
    settings: Callable[..., AgentSettings],
    conductor: str,
    tmp_path: Path,
    name: str,
) -> None:
    """The checks refuse nothing `Staging.stage` records, names with spaces and dots included.
    The accepted attempt's process died before renaming: the next holder publishes."""
    entry_id = await delivered_to_me(conductor, redis, f"rc-own-{len(name)}")
    report = await old_owner(redis, entry_id)
    assert (await post(conductor, type="WORK_STARTED", **report)).json() == {"attempt": 1}
    area = staging.Staging(entry_id=entry_id, attempt=1)
    area.stage(tmp_path / "deep" / name).write_text(name)
    outputs = [{"staged": o.staged, "path": o.path} for o in staging.outputs(area.close())]
    answer = await post(conductor, type="WORK_COMPLETED", attempt=1, outputs=outputs, **report)
    assert answer.status_code == 202, answer.text
    await back_to_me(redis, entry_id)
    async with running(lambda entry: None, settings()):
        await wait_for(lambda: drained(redis))
    assert [p.name for p in (tmp_path / "deep").iterdir()] == [name]
    assert (tmp_path / "deep" / name).read_text() == name
    assert await published(engine, entry_id) is True
