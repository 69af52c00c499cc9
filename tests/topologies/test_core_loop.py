"""The core loop as users run it, on each Redis topology: `rig-conductor serve` and `agent`
processes, heartbeats, dispatch, a SIGKILLed agent whose entries are reclaimed, a poison entry
dead-lettered, and the audit over it all finding nothing lost and nothing done twice.

The topologies: a 3+3 Redis Cluster, a master and replica behind 3 sentinels (dispatch waits
for the replica), a TLS-only server with a CA and a client certificate, and ACL users holding
exactly the rules the README documents.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis import keys as redis_keys
from tests.e2e.fleet import (
    GROUP,
    ONE_READ,
    STREAM,
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    effects,
    heard_from,
    run_audit,
)
from tests.integration.helpers import serve, wait_for

from .conftest import agent_url, env_settings

ISSUES = [f"rc-{n}" for n in range(1, 13)]
POISON = "rc-poison"
VICTIM = ("builder-b", "builder-b-pod-0")
SURVIVOR = ("builder-a", "builder-a-pod-0")
RECLAIMED = re.compile(r"\[StreamReclaim\] Reclaimed (\S+) on (\S+): (\S+) -> (\S+)")

TOPOLOGIES = ["cluster", "sentinel", "tls", "acl"]


@pytest.mark.parametrize("topology", TOPOLOGIES)
async def test_the_core_loop_on_each_topology(
    topology: str,
    request: pytest.FixtureRequest,
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
) -> None:
    # (conductor's env, agents' env): the same server, each with its own settings and user.
    conductor_side, agent_side = request.getfixturevalue(f"{topology}_envs")
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    settings = env_settings(conductor_side, database_url)
    redis = redis_client.connect(settings)
    extra = {"RIG_MAX_DELIVERIES": "2", "RIG_SCAN_INTERVAL_S": "0.5"}
    env = {**conductor_env([VICTIM[0], SURVIVOR[0]]), **conductor_side, **extra}
    url = env.pop("RIG_REDIS_URL")
    try:
        async with (
            serve(url, database_url, **env) as conductor,
            httpx.AsyncClient(base_url=conductor.url) as api,
        ):
            agents = {**agent_side, "E2E_OUT_DIR": str(out), "RIG_MAX_DELIVERIES": "2"}
            agent_url_of_all = agents.pop("RIG_REDIS_URL")
            with Fleet(agent_url_of_all, conductor.url, tmp_path, agents) as fleet:
                victim = fleet.start(
                    *VICTIM,
                    E2E_FAIL_FIRST="1",
                    E2E_HOLD_FILE=str(hold),
                    RIG_REDIS_URL=agent_url(agent_url_of_all, VICTIM[0]),
                    **ONE_READ,
                )
                await wait_for(lambda: heard_from(api, victim.consumer), within=30)
                entries = {issue: await dispatch(api, issue, {"n": issue}) for issue in ISSUES}
                await wait_for(lambda: (out / f"holding-{victim.consumer}").exists(), within=30)
                held = {
                    row["message_id"]
                    for row in await redis.xpending_range(
                        STREAM, GROUP, min="-", max="+", count=100, consumername=victim.consumer
                    )
                }
                assert len(held) >= 2, held  # the failed build and the one in progress
                victim.kill()
                survivor = fleet.start(
                    *SURVIVOR, RIG_REDIS_URL=agent_url(agent_url_of_all, SURVIVOR[0])
                )
                poison = await dispatch(api, POISON, {"poison": True})
                dlq = redis_keys.dlq_key(STREAM, clustered=topology == "cluster")

                async def settled() -> bool:
                    done = await accepted_completions(engine)
                    return set(entries.values()) <= set(done) and bool(
                        await redis.xrange(dlq, count=1)
                    )

                async def state() -> str:
                    done = await accepted_completions(engine)
                    missing = sorted(i for i, e in entries.items() if e not in done)
                    pending = await redis.xpending(STREAM, GROUP)
                    return (
                        f"not completed: {missing}; dead letters: {await redis.xrange(dlq)}; "
                        f"pending: {pending}\n--- conductor:\n{conductor.stderr[-6000:]}\n"
                        f"{fleet.tails()}"
                    )

                await wait_for(settled, within=60, explain=state)
                codes = fleet.stop_all()
                letters = [fields["originalId"] for _, fields in await redis.xrange(dlq)]
    finally:
        await redis.aclose()

    expected = {victim.consumer: -9, survivor.consumer: 0}
    assert codes == expected, fleet.logs(codes, expected)
    assert "Scan failed" not in conductor.stderr, conductor.stderr[-3000:]
    moved = {entry for entry, stream, source, _ in RECLAIMED.findall(conductor.stderr)
             if stream == STREAM and source == victim.consumer}  # fmt: skip
    assert held <= moved, conductor.stderr[-3000:]
    assert letters == [poison]
    completions = await accepted_completions(engine)
    assert {entries[i]: len(completions.get(entries[i], [])) for i in ISSUES} == dict.fromkeys(
        entries.values(), 1
    )
    assert sorted(effects(out)) == sorted(ISSUES)

    summary = run_audit(database_url, url, tmp_path / "audit", conductor_side)
    assert summary["lost"] == [] and summary["duplicates"] == []
    assert summary["deadLettered"] == 1 and summary["completed"] == len(ISSUES)
