"""A chaos soak with a Redis failover in the middle.

Real processes behind sentinels: `rig-conductor serve` with RIG_REDIS_WAIT_REPLICAS=1 and four
agents. Issues are dispatched steadily (a 503 or a dropped connection is retried with the same
issue id, as a client would); every 2 s an agent is SIGKILLed and a new pod of it started; when
half the issues are out, the Redis master is SIGKILLed and a sentinel promotes the replica.
At the end every acknowledged issue was done exactly once: 0 lost, 0 doubled.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import Fleet, accepted_completions, conductor_env, effects
from tests.integration.helpers import serve, wait_for

from .servers import SentinelSet
from .test_sentinel import dispatch_until_accepted

ISSUES = [f"soak-{n}" for n in range(120)]
AGENTS = [f"soak-w{n}" for n in range(4)]
KILL_EVERY_S = 2.0


async def test_a_failover_mid_soak_loses_nothing_and_does_nothing_twice(
    sentinels: SentinelSet,
    sentinel_envs: tuple[dict[str, str], dict[str, str]],
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
) -> None:
    conductor_side, agent_side = sentinel_envs
    out = tmp_path / "out"
    env = {**conductor_env(AGENTS), **conductor_side}
    url = env.pop("RIG_REDIS_URL")
    chance = random.Random(7)
    acknowledged: dict[str, str] = {}
    kills = 0
    async with (
        serve(url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url, timeout=15) as api,
    ):
        agents_env = {**agent_side, "E2E_OUT_DIR": str(out), "E2E_WORK_S": "0.05"}
        with Fleet(agents_env.pop("RIG_REDIS_URL"), conductor.url, tmp_path, agents_env) as fleet:
            pods = {agent: fleet.start(agent, f"{agent}-pod-0") for agent in AGENTS}
            generation = dict.fromkeys(AGENTS, 0)
            failed_over = asyncio.Event()

            async def fail_over() -> None:
                old = sentinels.master_port()
                sentinels.server(old).kill()
                await wait_for(lambda: sentinels.master_port() != old, within=30)
                await asyncio.to_thread(sentinels.restart_as_replica, old)

            async def dispatcher() -> None:
                for n, issue in enumerate(ISSUES):
                    acknowledged[issue] = await dispatch_until_accepted(api, issue, within=90)
                    if n == len(ISSUES) // 2:
                        await fail_over()
                        failed_over.set()
                    await asyncio.sleep(0.05)  # a steady flow of work, not a burst

            async def chaos() -> None:
                nonlocal kills
                while len(acknowledged) < len(ISSUES):
                    await asyncio.sleep(KILL_EVERY_S)  # chaos at a steady pace
                    agent = chance.choice(AGENTS)
                    pods[agent].kill()
                    kills += 1
                    generation[agent] += 1
                    pods[agent] = fleet.start(agent, f"{agent}-pod-{generation[agent]}")

            # A task group: when one side fails, the other is cancelled before the fleet closes,
            # so no pod is started after the fleet has stopped them all.
            async with asyncio.TaskGroup() as both:
                both.create_task(dispatcher())
                both.create_task(chaos())
            assert failed_over.is_set()

            async def all_done() -> bool:
                # Accepted, and committed: an agent killed between the two leaves its recorded
                # intent for the entry's next owner to commit (after the reclaim).
                completed = await accepted_completions(engine)
                committed = set(effects(out)) == set(ISSUES)
                return set(acknowledged.values()) <= set(completed) and committed

            await wait_for(all_done, within=120)
            fleet.stop_all()
        assert conductor.process.poll() is None, "the conductor must survive the failover"

    completions = await accepted_completions(engine)
    doubled = {entry: len(done) for entry, done in completions.items() if len(done) > 1}
    lost = [issue for issue, entry in acknowledged.items() if entry not in completions]
    assert (lost, doubled) == ([], {}), conductor.stderr[-3000:]
    assert sorted(effects(out)) == sorted(ISSUES)  # each effect committed, once per issue
    assert kills >= 3
