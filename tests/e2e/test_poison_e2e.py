"""A poison entry (its handler fails every time) ends in `<stream>:dlq` after RIG_MAX_DELIVERIES
deliveries instead of bouncing forever; every other issue completes.

Real processes: `rig-conductor serve` and two `rig-conductor agent` processes in one group.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.helpers import serve, wait_for

from .fleet import (
    GROUP,
    STREAM,
    Fleet,
    accepted_completions,
    calls,
    conductor_env,
    dead_letters,
    dispatch,
    effects,
    heard_from,
    pending,
    staged_leftovers,
    work_events,
)

pytestmark = pytest.mark.timeout(240)

MAX_DELIVERIES = 3
ISSUES = [f"rc-{n}" for n in range(1, 13)]
POISON = "rc-7"
AGENTS = [("builder-a", "builder-a-pod-0"), ("builder-c", "builder-c-pod-0")]


async def test_a_poison_entry_is_dead_lettered_after_max_deliveries(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    limit = {"RIG_MAX_DELIVERIES": str(MAX_DELIVERIES)}
    env = conductor_env([agent for agent, _ in AGENTS], **limit)
    agent_env = {"E2E_OUT_DIR": str(out), "E2E_WORK_S": "0.02", **limit}
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, agent_env) as fleet:
            agents = [fleet.start(*agent) for agent in AGENTS]
            for agent in agents:
                await wait_for(lambda: heard_from(api, agent.consumer), within=30)  # noqa: B023
            entries = {
                issue: await dispatch(api, issue, {"poison": issue == POISON}) for issue in ISSUES
            }
            poison = entries[POISON]
            healthy = {entry for issue, entry in entries.items() if issue != POISON}

            async def settled() -> bool:
                done = await accepted_completions(engine)
                letters = await dead_letters(redis)
                return healthy <= set(done) and poison in letters and not await pending(redis)

            await wait_for(settled, within=40)
            # Two more pending-list reads of every agent: nothing runs it again.
            await asyncio.sleep(2.5)
            codes = fleet.stop_all()
        listed = (await api.get("/api/deadletters")).json()

    expected = {agent.consumer: 0 for agent in agents}
    assert codes == expected, fleet.logs(codes, expected)
    assert "Scan failed" not in conductor.stderr, conductor.stderr[-3000:]

    # Dead-lettered once, with the reason and the deliveries, the original fields kept.
    letters = await dead_letters(redis)
    assert list(letters) == [poison]
    letter = letters[poison]
    assert (letter["stream"], letter["group"], letter["issueId"]) == (STREAM, GROUP, POISON)
    assert letter["consumer"] in {agent.consumer for agent in agents}
    assert letter["reason"] == "max-deliveries"
    assert int(letter["deliveries"]) >= MAX_DELIVERIES
    assert letter["type"] == "ISSUE_ASSIGNED" and json.loads(letter["payload"]) == {"poison": True}
    (view,) = listed
    assert (view["originalId"], view["reason"]) == (poison, "max-deliveries")
    assert view["deliveries"] == int(letter["deliveries"])

    # The handler ran exactly RIG_MAX_DELIVERIES times on it, each a failed attempt.
    assert len(calls(out, POISON)) == MAX_DELIVERIES
    reports = await work_events(engine, poison)
    assert [kind for kind, _, _ in reports] == ["WORK_STARTED", "WORK_FAILED"] * MAX_DELIVERIES
    assert not any(fenced for _, _, fenced in reports)

    # Everything else completed once, with one committed file each; nothing is left pending.
    completions = await accepted_completions(engine)
    assert set(completions) == healthy
    assert all(len(reports) == 1 for reports in completions.values())
    assert sorted(effects(out)) == sorted(issue for issue in ISSUES if issue != POISON)
    assert staged_leftovers(out) == []
    assert await pending(redis) == {}
