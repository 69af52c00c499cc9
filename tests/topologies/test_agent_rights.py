"""An agent under its own Redis user (`rig-conductor redis-acl --agent-id`) does its whole job,
and Redis refuses it everything else. A real `rig-conductor serve` under the conductor's user,
a real `rig-conductor agent` under `rig-agent-builder-a`: it joins, reads, completes an issue,
and has a poison entry dead-lettered (asked of the conductor). Then `ACL DRYRUN` checks, for
that user, every command and key the contract says an agent may not touch."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.redis import keys as redis_keys
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    heard_from,
)
from tests.integration.helpers import serve, wait_for

from .conftest import acl_admin, agent_url

AGENT = "builder-a"
USER = f"rig-agent-{AGENT}"
OTHER_LEASE = redis_keys.lease_key("builder-b", STREAM, GROUP, "builder-b-pod-0")

# What an agent's user must never do (contract: "Redis rights").
REFUSED: list[tuple[str, ...]] = [
    ("XADD", STREAM, "*", "type", "ISSUE_ASSIGNED"),
    ("XCLAIM", STREAM, GROUP, "thief", "0", "1-0"),
    ("XAUTOCLAIM", STREAM, GROUP, "thief", "0", "0-0"),
    ("XDEL", STREAM, "1-0"),
    ("XTRIM", STREAM, "MAXLEN", "0"),
    ("XSETID", STREAM, "99999999999-0"),
    ("DEL", STREAM),
    ("XGROUP", "DESTROY", STREAM, GROUP),
    ("XGROUP", "SETID", STREAM, GROUP, "$"),
    ("XGROUP", "DELCONSUMER", STREAM, GROUP, "builder-b-pod-0"),
    ("SET", redis_keys.dispatched_key(STREAM, "rc-1"), "1-0"),
    ("DEL", redis_keys.epoch_key(STREAM)),
    ("SET", redis_keys.epoch_key(STREAM), "forged"),
    ("XADD", redis_keys.dlq_key(STREAM), "*", "originalId", "1-0"),
    ("DEL", redis_keys.revoked_session_key(STREAM, "nonce")),
    ("SET", OTHER_LEASE, "mine"),
    ("DEL", OTHER_LEASE),
    ("FLUSHDB",),
    ("FLUSHALL",),
    ("CONFIG", "GET", "*"),
    ("ACL", "LIST"),
    ("KEYS", "*"),
    ("SCRIPT", "FLUSH"),
    ("SHUTDOWN",),
    ("CLIENT", "KILL", "ID", "1"),
    ("MONITOR",),
    ("DEBUG", "SLEEP", "0"),
]
ALLOWED: list[tuple[str, ...]] = [
    ("XREADGROUP", "GROUP", GROUP, f"{AGENT}-pod-0", "STREAMS", STREAM, ">"),
    ("XACK", STREAM, GROUP, "1-0"),
    ("XPENDING", STREAM, GROUP),
    ("XGROUP", "CREATECONSUMER", STREAM, GROUP, f"{AGENT}-pod-0"),
    ("SET", redis_keys.lease_key(AGENT, STREAM, GROUP, f"{AGENT}-pod-0"), "me"),
]


def dryrun(port: int, command: tuple[str, ...]) -> str:
    answer = acl_admin(port).execute_command("ACL", "DRYRUN", USER, *command)
    return answer.decode() if isinstance(answer, bytes) else str(answer)


@pytest.mark.timeout(300)
async def test_an_agent_works_under_its_own_user_and_may_do_nothing_else(
    acl_server: int,
    acl_envs: tuple[dict[str, str], dict[str, str]],
    engine: AsyncEngine,
    database_url: str,
    tmp_path: Path,
) -> None:
    conductor_side, agent_side = acl_envs
    env = {**conductor_env([AGENT]), **conductor_side, "RIG_MAX_DELIVERIES": "2"}
    url = env.pop("RIG_REDIS_URL")
    out = tmp_path / "out"
    admin = acl_admin(acl_server)
    async with (
        serve(url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        agents = {"E2E_OUT_DIR": str(out), "RIG_MAX_DELIVERIES": "2"}
        own = agent_url(agent_side["RIG_REDIS_URL"], AGENT)
        with Fleet(own, conductor.url, tmp_path, agents) as fleet:
            agent = fleet.start(AGENT, f"{AGENT}-pod-0")
            await wait_for(lambda: heard_from(api, agent.consumer), within=60)
            assert admin.keys(f"{redis_keys.agent_prefix(AGENT)}*")  # its lease, in its keys
            done = await dispatch(api, "rc-1", {})
            poison = await dispatch(api, "rc-poison", {"poison": True})

            async def finished() -> bool:
                dlq = admin.xrange(redis_keys.dlq_key(STREAM))
                letters = {fields["originalId"] for _, fields in dlq}
                return done in await accepted_completions(engine) and poison in letters

            await wait_for(finished, within=90, explain=lambda: fleet.tails())
            assert fleet.stop_all() == {agent.consumer: 0}, fleet.tails()
    assert "Refusing to start" not in agent.output()
    assert "has the conductor's rights" not in agent.output()  # no warning: its own user
    assert "Refused DEAD_LETTER" not in conductor.stderr
    for command in ALLOWED:
        assert dryrun(acl_server, command) == "OK", command
    for command in REFUSED:
        assert "no permissions" in dryrun(acl_server, command), command
