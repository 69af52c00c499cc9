"""A worker dies holding entries; the conductor reclaims them and a survivor finishes them.

Real processes throughout: `rig-conductor serve` and three `rig-conductor agent` processes in one
consumer group. `builder-b` is a flaky worker: its first two builds fail (the entries stay in
its pending list) and its third blocks, as in a long build. It is SIGKILLed while it holds them.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.helpers import serve, wait_for

from .fleet import (
    ONE_READ,
    STREAM,
    Fleet,
    accepted_completions,
    conductor_env,
    dead_letters,
    dispatch,
    effects,
    heard_from,
    pending,
    staged_leftovers,
)

pytestmark = pytest.mark.timeout(240)

ISSUES = [f"rc-{n}" for n in range(1, 31)]
VICTIM = ("builder-b", "builder-b-pod-0")
SURVIVORS = [("builder-a", "builder-a-pod-0"), ("builder-c", "builder-c-pod-0")]
RECLAIMED = re.compile(r"\[StreamReclaim\] Reclaimed (\S+) on (\S+): (\S+) -> (\S+)")


async def test_a_killed_agents_entries_are_reclaimed_and_completed_exactly_once(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    agent_ids = [VICTIM[0]] + [agent for agent, _ in SURVIVORS]
    env = conductor_env(agent_ids)
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            victim = fleet.start(*VICTIM, E2E_FAIL_FIRST="2", E2E_HOLD_FILE=str(hold), **ONE_READ)
            await wait_for(lambda: heard_from(api, victim.consumer), within=30)
            entries = {issue: await dispatch(api, issue, {"title": issue}) for issue in ISSUES}
            await wait_for(lambda: (out / f"holding-{victim.consumer}").exists(), within=15)
            held = set(await pending(redis, victim.consumer))
            assert len(held) >= 2, held  # two failed builds and the one in progress

            survivors = [fleet.start(*agent) for agent in SURVIVORS]
            await wait_for(lambda: len(effects(out)) >= 5, within=30)  # up and working
            victim.kill()

            async def settled() -> bool:
                done = await accepted_completions(engine)
                return set(entries.values()) <= set(done) and not await pending(redis)

            await wait_for(settled, within=40)
            codes = fleet.stop_all()
        deadletters = (await api.get("/api/deadletters")).json()

    survivor_names = {agent.consumer for agent in survivors}
    expected = {victim.consumer: -9, **dict.fromkeys(survivor_names, 0)}
    assert codes == expected, fleet.logs(codes, expected)
    for agent in survivors:
        assert "Traceback" not in agent.output(), agent.output()[-3000:]

    # The reaper moved exactly what the dead consumer held, to a survivor.
    assert "Scan failed" not in conductor.stderr, conductor.stderr[-3000:]
    moves = [
        (entry_id, source, target)
        for entry_id, stream, source, target in RECLAIMED.findall(conductor.stderr)
        if stream == STREAM
    ]
    assert sorted(entry_id for entry_id, _, _ in moves) == sorted(held), conductor.stderr[-3000:]
    assert {source for _, source, _ in moves} == {victim.consumer}
    assert {target for _, _, target in moves} <= survivor_names

    # Every issue completed exactly once: one accepted completion, one committed file.
    completions = await accepted_completions(engine)
    assert {entry: len(completions.get(entry, [])) for entry in entries.values()} == dict.fromkeys(
        entries.values(), 1
    )
    assert {completions[entry][0].consumer for entry in held} <= survivor_names
    files = effects(out)
    assert sorted(files) == sorted(ISSUES)
    for issue, entry_id in entries.items():
        (accepted,) = completions[entry_id]
        effect = files[issue]
        assert (effect["entryId"], effect["consumer"], effect["attempt"]) == (
            entry_id,
            accepted.consumer,
            accepted.attempt,
        ), issue
    assert staged_leftovers(out) == []
    assert await pending(redis) == {}
    assert await dead_letters(redis) == {} and deadletters == []
