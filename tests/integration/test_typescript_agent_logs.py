"""What a TypeScript agent says, in the Python runtime's words, against real servers and processes
of both runtimes: with RIG_LOG_FORMAT=json every line of either is one JSON object with the same
head (`time`, `level`, `logger`, `message`), and each entry's line carries the same fields
(`entryId`, `issueId`, `attempt`, `outcome`, `stream`, `group`, `consumer`).

Off CI a machine without Node skips; with CI set, that fails (`tests.needs`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import (
    GROUP,
    STREAM,
    AgentProcess,
    Fleet,
    conductor_env,
    dispatch,
    heard_from,
)

from .helpers import serve, wait_for
from .ts_agent import WITHIN, rig_agent_fixture, settled, start_ts  # noqa: F401

pytestmark = pytest.mark.timeout(300)

JSON_LOGS = {"RIG_LOG_FORMAT": "json"}
HEAD = ["time", "level", "logger", "message"]
ENTRY_FIELDS = ["entryId", "issueId", "attempt", "outcome", "stream", "group", "consumer"]
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


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
    assert len(outcomes) == 1, outcomes  # one outcome, in one wording
    node = json_lines(runs["builder-ts-0"][0])
    assert {line["logger"] for line in node} == {"rig-agent"}
