"""The TypeScript runtime (`rig-agent`) on each Redis topology, as the Python runtime's core
loop runs on them (`test_core_loop.py`): a Redis Cluster, a master behind sentinels, a TLS-only
server with a client certificate, and its own least-privilege ACL user. The agent reads its
settings as the Python one does (`RIG_REDIS_MODE`, `RIG_REDIS_SENTINELS`, `RIG_REDIS_TLS_*`),
and each issue is completed once with its output published."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import (
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    effects,
    heard_from,
)
from tests.integration.helpers import serve, wait_for
from tests.integration.ts_agent import (
    rig_agent_fixture,  # noqa: F401 - the `rig_agent` fixture
    start_ts,
)

from .conftest import agent_url

ISSUES = ["rc-1", "rc-2", "rc-3"]
AGENT = ("builder-a", "builder-a-ts-0")


@pytest.mark.parametrize("topology", ["cluster", "sentinel", "tls", "acl"])
async def test_a_typescript_agent_completes_work_on_each_topology(
    topology: str,
    rig_agent: list[str],
    request: pytest.FixtureRequest,
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
) -> None:
    conductor_side, agent_side = request.getfixturevalue(f"{topology}_envs")
    out = tmp_path / "out"
    env = {**conductor_env([AGENT[0]]), **conductor_side}
    url = env.pop("RIG_REDIS_URL")
    async with (
        serve(url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        agents = {**agent_side, "E2E_OUT_DIR": str(out)}
        agents_url = agent_url(agents.pop("RIG_REDIS_URL"), AGENT[0])
        with Fleet(agents_url, conductor.url, tmp_path, agents) as fleet:
            agent = start_ts(fleet, rig_agent, *AGENT)
            await wait_for(lambda: heard_from(api, agent.consumer), within=60, explain=fleet.tails)
            entries = {issue: await dispatch(api, issue, {"n": issue}) for issue in ISSUES}

            async def done() -> bool:
                return set(entries.values()) <= set(await accepted_completions(engine))

            await wait_for(done, within=60, explain=fleet.tails)
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    output = agent.output()
    assert "NOPERM" not in output and "Redis unavailable" not in output, output[-3000:]
    completions = await accepted_completions(engine)
    assert [len(completions[entries[issue]]) for issue in ISSUES] == [1, 1, 1]
    assert sorted(effects(out)) == ISSUES
    assert {effects(out)[issue]["consumer"] for issue in ISSUES} == {agent.consumer}
