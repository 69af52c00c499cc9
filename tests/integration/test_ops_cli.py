"""The operator commands (`rig-conductor work | pending | move | deadletters | reclaims`) as an
operator runs them: subprocesses talking to a real `rig-conductor serve`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from .helpers import read, register, serve

S, G = "rig:dispatch", "workers"
OPERATOR, VIEWER, AGENT = "op-secret-0123456789", "view-secret-012345678", "agent-secret-01234567"

# Each command is a fresh interpreter: on a loaded 2-core machine one takes seconds to start.
pytestmark = pytest.mark.timeout(360)


async def cli(
    url: str, token: str | None, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(RIG_CONDUCTOR_URL=url, RIG_DISPATCH_STREAM=S, **env)
    if token is not None:
        environment["RIG_API_TOKEN"] = token
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "rig_conductor", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]


async def test_an_operator_finds_moves_and_follows_the_work(
    redis_url: str, database_url: str, redis: Redis, engine: AsyncEngine
) -> None:
    env = {
        "RIG_OPERATOR_TOKENS": OPERATOR,
        "RIG_VIEWER_TOKENS": VIEWER,
        "RIG_API_TOKENS": AGENT,
        "RIG_ALLOW_ANONYMOUS": "false",
        "RIG_STREAMS": S,
        "RIG_DISPATCH_STREAM": S,
        "RIG_AGENT_IDS": "dev-e,qa-e",
        "RIG_STARTUP_DELAY_S": "3600",
    }
    async with serve(redis_url, database_url, **env) as conductor:
        url = conductor.url
        bearer = {"Authorization": f"Bearer {AGENT}"}
        async with httpx.AsyncClient(base_url=url, headers=bearer) as api:

            async def event(body: dict[str, Any]) -> Any:
                answer = await api.post("/api/events", json=body)
                assert answer.status_code < 300, answer.text
                return answer.json()

            await redis.xgroup_create(S, G, id="0", mkstream=True)
            entry = (
                await event(
                    {"type": "ISSUE_ASSIGNED", "issueId": "rc-1", "agentId": "dev-e", "payload": {}}
                )
            )["entryId"]
            assert await read(redis, S, G, "dev-e-0", 1) == [entry]

            def work(kind: str, consumer: str, **extra: Any) -> dict[str, Any]:
                return {
                    "type": kind,
                    "agentId": consumer.rsplit("-", 1)[0],
                    "consumer": consumer,
                    "stream": S,
                    "group": G,
                    "entryId": entry,
                    "issueId": "rc-1",
                    **extra,
                }

            await event(work("WORK_STARTED", "dev-e-0"))
            await register(redis, S, G, "qa-e-0")
            await event({"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"})

            table = await cli(url, VIEWER, "pending", S, G)
            assert table.returncode == 0, table.stderr
            assert table.stdout.splitlines()[0].split() == [
                "ENTRY",
                "CONSUMER",
                "IDLE_MS",
                "DELIVERIES",
                "ISSUE",
            ]
            assert entry in table.stdout and "dev-e-0" in table.stdout and "rc-1" in table.stdout
            rows = as_json(await cli(url, VIEWER, "pending", S, G, "-o", "json"))
            assert [(r["entryId"], r["consumer"]) for r in rows] == [(entry, "dev-e-0")]

            one_line(await cli(url, VIEWER, "move", S, G, entry, "--to", "qa-e-0"), 1, "403")
            await register(redis, S, G, "dev-e-1")  # dev-e never heartbeated: down
            one_line(await cli(url, OPERATOR, "move", S, G, entry, "--to", "dev-e-1"), 1, "409")
            moved = await cli(url, OPERATOR, "move", S, G, entry, "--to", "qa-e-0")
            assert moved.returncode == 0, moved.stderr
            assert f"{entry}  moved" in moved.stdout

            history = as_json(await cli(url, VIEWER, "reclaims", "-o", "json"))
            assert [(h["from"], h["to"], h["reason"]) for h in history] == [
                ("dev-e-0", "qa-e-0", "manual")
            ]
            listed = await cli(url, VIEWER, "reclaims", "--reason", "manual")
            assert "dev-e-0" in listed.stdout and "qa-e-0" in listed.stdout

            await event(work("WORK_STARTED", "qa-e-0"))
            await event(work("WORK_COMPLETED", "qa-e-0", attempt=2))
            await redis.xack(S, G, entry)

        story = as_json(await cli(url, VIEWER, "work", "rc-1", "-o", "json"))
        assert [i["kind"] for i in story["timeline"]] == [
            "DISPATCHED",
            "STARTED",
            "RECLAIMED",
            "STARTED",
            "COMPLETED",
        ]
        assert story["state"] == "done"
        told = await cli(url, VIEWER, "work", "rc-1")
        assert told.returncode == 0, told.stderr
        kinds = [line.split()[1] for line in told.stdout.splitlines() if line.startswith("20")]
        assert kinds == ["DISPATCHED", "STARTED", "RECLAIMED", "STARTED", "COMPLETED"]
        assert "dev-e-0 -> qa-e-0; manual" in told.stdout
        by_entry = as_json(await cli(url, VIEWER, "work", entry, "--stream", S, "-o", "json"))
        assert by_entry["timeline"] == story["timeline"]

        one_line(await cli(url, VIEWER, "work", "rc-404"), 1, "404", "rc-404")
        one_line(await cli(url, None, "work", "rc-1"), 1, "401")
        letters = await cli(url, VIEWER, "deadletters", "list")
        assert letters.returncode == 0 and letters.stdout.startswith("DLQ_ID")
        one_line(await cli(url, OPERATOR, "deadletters", "requeue"), 2, "--reason")
        none = as_json(
            await cli(url, OPERATOR, "deadletters", "delete", "--text", "x", "-o", "json")
        )
        assert none == {"stream": S, "deleted": 0}


async def test_bad_configuration_exits_2_naming_the_variable() -> None:
    one_line(await cli("ftp://somewhere", None, "work", "rc-1"), 2, "RIG_CONDUCTOR_URL")
    missing = await cli(
        "http://127.0.0.1:1", None, "reclaims", RIG_API_TOKEN_FILE="/nonexistent/token"
    )
    one_line(missing, 2, "RIG_API_TOKEN_FILE")
    unreachable = await cli("http://127.0.0.1:1", None, "reclaims")
    one_line(unreachable, 1, "RIG_CONDUCTOR_URL")
