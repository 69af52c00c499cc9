"""A Sentinel failover under load: the master is SIGKILLed, a sentinel promotes the replica, and
the conductor and the agents go on against the new master without a restart. With
RIG_REDIS_WAIT_REPLICAS=1 every dispatch answered 201 before the kill is on the new master."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.redis import client as redis_client
from tests.e2e.fleet import STREAM, Fleet, accepted_completions, conductor_env, heard_from
from tests.integration.helpers import serve, wait_for

from .conftest import env_settings
from .servers import SentinelSet

AGENT = ("builder-a", "builder-a-pod-0")


async def dispatch_until_accepted(api: httpx.AsyncClient, issue: str, within: float = 60) -> str:
    """POST the dispatch, again with the same issue id while the conductor answers 503 (no
    master yet, or the replica not caught up): the idempotency key makes retries safe."""
    found: dict[str, str] = {}

    async def accepted() -> bool:
        try:
            answer = await api.post(
                "/api/events",
                json={"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "builder"},
            )
        except httpx.TransportError:
            return False
        if answer.status_code in (200, 201):
            found["entry"] = answer.json()["entryId"]
            return True
        assert answer.status_code == 503, answer.text
        return False

    await wait_for(accepted, within=within)
    return found["entry"]


async def test_conductor_and_agents_follow_a_failover_without_a_restart(
    sentinels: SentinelSet,
    sentinel_envs: tuple[dict[str, str], dict[str, str]],
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
) -> None:
    conductor_side, agent_side = sentinel_envs
    out = tmp_path / "out"
    env = {**conductor_env([AGENT[0]]), **conductor_side}
    url = env.pop("RIG_REDIS_URL")
    before = [f"before-{n}" for n in range(10)]
    after = [f"after-{n}" for n in range(10)]
    async with (
        serve(url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url, timeout=15) as api,
    ):
        agents = {**agent_side, "E2E_OUT_DIR": str(out)}
        with Fleet(agents.pop("RIG_REDIS_URL"), conductor.url, tmp_path, agents) as fleet:
            agent = fleet.start(*AGENT)
            await wait_for(lambda: heard_from(api, agent.consumer), within=30)
            acknowledged = {issue: await dispatch_until_accepted(api, issue) for issue in before}

            old = sentinels.master_port()
            sentinels.server(old).kill()
            await wait_for(lambda: sentinels.master_port() != old, within=30)
            sentinels.restart_as_replica(old)
            for issue in after:
                acknowledged[issue] = await dispatch_until_accepted(api, issue)

            async def done() -> bool:
                completed = await accepted_completions(engine)
                return set(acknowledged.values()) <= set(completed)

            await wait_for(done, within=60)
            assert agent.process.poll() is None, "the agent must survive the failover"
            assert conductor.process.poll() is None, "the conductor must survive the failover"
            codes = fleet.stop_all()

    assert codes == {agent.consumer: 0}, fleet.logs(codes, {agent.consumer: 0})
    # Every dispatch acknowledged before the kill reached the replica that is master now.
    client = redis_client.connect(env_settings(agent_side, database_url))
    try:
        on_new_master = {entry_id for entry_id, _ in await client.xrange(STREAM)}
    finally:
        await client.aclose()
    assert {acknowledged[issue] for issue in before} <= on_new_master
    completions = await accepted_completions(engine)
    assert all(len(completions[entry]) == 1 for entry in acknowledged.values())
