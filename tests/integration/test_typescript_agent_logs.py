"""What a TypeScript agent says, in the Python runtime's words, against real servers and processes
of both runtimes: with RIG_LOG_FORMAT=json every line of either is one JSON object with the same
head (`time`, `level`, `logger`, `message`), and each entry's line carries the same fields
(`entryId`, `issueId`, `attempt`, `outcome`, `stream`, `group`, `consumer`); at start, an agent
whose Redis user lacks a right an agent needs refuses to start (exit 2) with the line the Python
runtime writes, before it touches the stream, and one whose user may add entries (the
conductor's rights) is warned about in the same words and keeps working. The users are the ones
`rig-conductor redis-acl` prints, on a Redis 7 server of the test's own (ACL selectors).

Off CI a machine without Node skips; with CI set, that fails (`tests.needs`)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import redis_rights
from rig_conductor.agent.lease import lease_key
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    AgentProcess,
    Fleet,
    conductor_env,
    dispatch,
    heard_from,
)

from .helpers import free_port, serve, wait_for
from .restartable import RestartableRedis
from .ts_agent import WITHIN, rig_agent_fixture, settled, start_ts  # noqa: F401

pytestmark = pytest.mark.timeout(300)

JSON_LOGS = {"RIG_LOG_FORMAT": "json"}
HEAD = ["time", "level", "logger", "message"]
ENTRY_FIELDS = ["entryId", "issueId", "attempt", "outcome", "stream", "group", "consumer"]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")
OVER_PRIVILEGED = "This agent's Redis user may add entries to"


def json_lines(agent: AgentProcess) -> list[dict[str, Any]]:
    """Every line the agent wrote, each of which must be one JSON object with the head."""
    lines = []
    for text in agent.output().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            pytest.fail(f"{agent.consumer}: not a JSON line: {text!r}")
        assert isinstance(line, dict) and list(line)[: len(HEAD)] == HEAD, text
        assert TIME.match(line["time"]) and line["level"] in {"INFO", "WARNING", "ERROR"}, text
        lines.append(line)
    return lines


def entry_lines(agent: AgentProcess) -> list[dict[str, Any]]:
    return [line for line in json_lines(agent) if "entryId" in line]


async def test_both_runtimes_write_the_same_json_lines_and_entry_fields(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    """A Python agent runs one issue, then a TypeScript agent of the same group another."""
    out = tmp_path / "out"
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        env = {"E2E_OUT_DIR": str(out), **JSON_LOGS}
        with Fleet(redis_url, conductor.url, tmp_path, env) as fleet:
            runs: dict[str, tuple[AgentProcess, str, str]] = {}
            starts: list[tuple[str, Callable[[], AgentProcess]]] = [
                ("rc-1", lambda: fleet.start("builder", "builder-py-0")),
                ("rc-2", lambda: start_ts(fleet, rig_agent, "builder", "builder-ts-0")),
            ]
            for issue, start in starts:
                agent = start()
                await wait_for(
                    lambda: heard_from(api, agent.consumer),  # noqa: B023
                    within=WITHIN,
                    explain=fleet.tails,
                )
                entry = await dispatch(api, issue, {})
                await wait_for(
                    lambda: settled(engine, redis, {entry}),  # noqa: B023
                    within=WITHIN,
                    explain=fleet.tails,
                )
                assert agent.stop() == 0, fleet.tails()
                runs[agent.consumer] = (agent, issue, entry)
    outcomes = set()
    for consumer, (agent, issue, entry) in runs.items():
        [line] = entry_lines(agent)
        assert list(line) == HEAD + ENTRY_FIELDS, line
        assert line["level"] == "INFO"
        assert {k: line[k] for k in ENTRY_FIELDS if k != "outcome"} == {
            "entryId": entry,
            "issueId": issue,
            "attempt": 1,
            "stream": STREAM,
            "group": GROUP,
            "consumer": consumer,
        }
        assert line["message"] == f"Entry {entry} (issue {issue}, attempt 1): {line['outcome']}"
        outcomes.add(line["outcome"])
        warned = [line for line in json_lines(agent) if line["level"] == "WARNING"]
        assert [w["message"].startswith(OVER_PRIVILEGED) for w in warned] == [True], warned
    assert len(outcomes) == 1, outcomes  # one outcome, in one wording
    python, node = (json_lines(agent) for agent, _, _ in runs.values())
    assert {line["logger"] for line in node} == {"rig-agent"}
    # The same start-up warning and entry sentences, word for word.
    assert [w["message"] for w in python if w["level"] == "WARNING"] == [
        w["message"] for w in node if w["level"] == "WARNING"
    ]


@pytest.fixture
async def acl_redis(restartable_redis: RestartableRedis) -> AsyncIterator[RestartableRedis]:
    """The test's own Redis 7, with `rig-agent-builder` exactly as `rig-conductor redis-acl`
    prints it and `no-read`, the same but for XREADGROUP."""
    admin = Redis.from_url(restartable_redis.url, decode_responses=True)
    async with contextlib.aclosing(admin):
        rules = redis_rights.agent_rules("builder", [STREAM])
        for user, given in (
            ("rig-agent-builder", rules),
            ("no-read", rules.replace("+xreadgroup ", "")),
        ):
            await admin.execute_command("ACL", "SETUSER", user, *given.split(), "on", ">agent-pw")
    yield restartable_redis


def user_url(server: RestartableRedis, user: str) -> str:
    return server.url.replace("redis://", f"redis://{user}:agent-pw@", 1)


async def test_a_user_without_a_right_is_refused_in_the_python_runtimes_words(
    rig_agent: list[str], acl_redis: RestartableRedis, tmp_path: Path
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # the refusal comes before any heartbeat
    with Fleet(user_url(acl_redis, "no-read"), nobody, tmp_path, JSON_LOGS) as fleet:
        python = fleet.start("builder", "builder-py-0")
        node = start_ts(fleet, rig_agent, "builder", "builder-ts-0")
        for agent in (python, node):
            assert agent.process.wait(timeout=WITHIN) == 2, agent.output()
    refusals = []
    for agent in (python, node):
        [error] = [line for line in json_lines(agent) if line["level"] == "ERROR"]
        refusals.append(error["message"])
    assert refusals[0] == refusals[1], refusals
    assert refusals[1].startswith(
        "Refusing to start: Redis user lacks a permission the agent needs: XREADGROUP ("
    ), refusals
    # Refused before it touched anything: no group, no stream, no consumer-name lease.
    admin = Redis.from_url(acl_redis.url, decode_responses=True)
    async with contextlib.aclosing(admin):
        assert await admin.exists(STREAM) == 0
        for consumer in ("builder-py-0", "builder-ts-0"):
            assert await admin.exists(lease_key("builder", STREAM, GROUP, consumer)) == 0


async def test_the_least_privilege_user_passes_the_check_and_the_default_user_is_warned_about(
    rig_agent: list[str], acl_redis: RestartableRedis, tmp_path: Path
) -> None:
    """The agent's own user: no warning, no refusal. The default user (every right): the
    warning, once, and the agent carries on to read."""
    nobody = f"http://127.0.0.1:{free_port()}"
    said = {}
    for url, tag in ((user_url(acl_redis, "rig-agent-builder"), "own"), (acl_redis.url, "all")):
        with Fleet(url, nobody, tmp_path / tag, JSON_LOGS) as fleet:
            node = start_ts(fleet, rig_agent, "builder", f"builder-ts-{tag}")
            await wait_for(
                lambda: "Agent builder reads" in node.output(),  # noqa: B023
                within=WITHIN,
                explain=fleet.tails,
            )
            assert node.stop() == 0, node.output()
        said[tag] = [(line["level"], line["message"]) for line in json_lines(node)]
    assert not [m for level, m in said["own"] if level == "ERROR" or OVER_PRIVILEGED in m]
    assert [level for level, m in said["all"] if OVER_PRIVILEGED in m] == ["WARNING"]
    assert (
        "WARNING",
        (
            f"{OVER_PRIVILEGED} {STREAM} (XADD): it has the conductor's rights, so this agent "
            "could forge dispatches, dead letters or markers. Give each agent its own user: "
            "`rig-conductor redis-acl --agent-id builder` prints it"
        ),
    ) in said["all"]
