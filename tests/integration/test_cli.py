"""The command line as operators run it: real processes, real servers, stdout vs stderr."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import intake
from rig_conductor.domain import AgentId, ConsumerName

from .helpers import fill, fresh_database, idle_at_least, owners, read, register


def run(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    return subprocess.run(
        [sys.executable, "-m", "rig_conductor", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def env(redis_url: str, database_url: str) -> dict[str, str]:
    return {
        "RIG_REDIS_URL": redis_url,
        "RIG_DATABASE_URL": database_url,
        "RIG_STREAMS": "rig:dispatch",
        "RIG_AGENT_IDS": "dev-e,qa-e",
        "RIG_ENTRY_STALE_MS": "100",
    }


@pytest.fixture
def empty_database_url(database_url: str) -> Iterator[str]:
    """A second, never-migrated database on the same server."""
    with fresh_database(database_url, "rig_empty") as url:
        yield url


async def test_reap_once_prints_the_report_as_json(
    redis: Redis, engine: AsyncEngine, env: dict[str, str]
) -> None:
    ids = await fill(redis, "rig:dispatch", "g", 2)
    await read(redis, "rig:dispatch", "g", "dev-e-0", 2)
    await register(redis, "rig:dispatch", "g", "qa-e-0")
    await intake.record_heartbeats(
        engine,
        tenant="default",
        heartbeats=[intake.HeartbeatIn(AgentId("qa-e"), ConsumerName("qa-e-0"))],
    )
    await idle_at_least(redis, "rig:dispatch", "g", 100)  # RIG_ENTRY_STALE_MS
    dry = await asyncio.to_thread(run, "reap", "--once", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["reclaimed"] == 2 and json.loads(dry.stdout)["dryRun"] is True
    assert "DRY RUN" in dry.stderr
    assert await owners(redis, "rig:dispatch", "g") == dict.fromkeys(ids, "dev-e-0")

    done = await asyncio.to_thread(run, "reap", "--once", env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # stdout is exactly one JSON document
    assert {
        k: report[k]
        for k in ("streams", "groups", "pending", "reclaimed", "deadLettered", "noTarget", "dryRun")
    } == {
        "streams": 1,
        "groups": 1,
        "pending": 2,
        "reclaimed": 2,
        "deadLettered": 0,
        "noTarget": 0,
        "dryRun": False,
    }
    assert isinstance(report["durationMs"], int)
    assert f"[StreamReclaim] Reclaimed {ids[0]} on rig:dispatch: dev-e-0 -> qa-e-0" in done.stderr
    assert await owners(redis, "rig:dispatch", "g") == dict.fromkeys(ids, "qa-e-0")


def test_reap_once_json_log_format(env: dict[str, str]) -> None:
    done = run("reap", "--once", env={**env, "RIG_LOG_FORMAT": "json", "RIG_DRY_RUN": "true"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["dryRun"] is True
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert any(line["message"].startswith("DRY RUN") for line in lines)


def test_reap_needs_once(env: dict[str, str]) -> None:
    done = run("reap", env=env)
    assert done.returncode == 2 and "--once" in done.stderr


def test_reap_with_redis_down_fails_in_one_line(env: dict[str, str]) -> None:
    done = run("reap", "--once", env={**env, "RIG_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode == 1
    assert done.stdout == ""
    assert "Scan failed: Redis unavailable" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(300)  # six commands, each a fresh interpreter
def test_schema_behind_is_refused_until_migrated(
    env: dict[str, str], empty_database_url: str
) -> None:
    behind = {**env, "RIG_DATABASE_URL": empty_database_url}
    reap = run("reap", "--once", env=behind)
    assert reap.returncode == 2
    assert "run `rig-conductor migrate`" in reap.stderr
    assert run("check", env=behind).returncode == 1
    open_ = {**behind, "RIG_HTTP_PORT": "1", "RIG_ALLOW_ANONYMOUS": "true"}
    serve = run("serve", env=open_)  # refused before it binds
    assert serve.returncode == 2
    assert "run `rig-conductor migrate`" in serve.stderr and "Traceback" not in serve.stderr
    first = run("migrate", env=behind)
    assert first.returncode == 0, first.stderr
    assert run("migrate", env=behind).returncode == 0  # idempotent
    check = run("check", env=behind)
    assert check.returncode == 0, check.stderr


def test_serve_without_any_token_refuses_to_start(env: dict[str, str]) -> None:
    done = run("serve", env={**env, "RIG_HTTP_PORT": "1"})  # refused before it binds
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("rig-conductor: RIG_API_TOKENS: no token of any role is set"), line
    assert "RIG_ALLOW_ANONYMOUS=true" in line


@pytest.mark.parametrize("variable", ["RIG_API_TOKENS", "RIG_OPERATOR_TOKENS", "RIG_VIEWER_TOKENS"])
def test_a_token_under_16_characters_is_refused_naming_its_variable(
    env: dict[str, str], variable: str
) -> None:
    tokens = "a-long-enough-token-1,fifteen-chars-x"
    done = run("serve", env={**env, "RIG_HTTP_PORT": "1", variable: tokens})
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line == f"rig-conductor: {variable}: every token must be at least 16 characters " + (
        "(e.g. `openssl rand -hex 24`)"
    )
    assert "fifteen" not in done.stderr  # a token is never echoed


def test_check_reports_an_unreachable_database(env: dict[str, str]) -> None:
    done = run("check", env={**env, "RIG_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/rig"})
    assert done.returncode == 1
    assert "PostgreSQL unreachable" in done.stderr and "Traceback" not in done.stderr


def test_demo_once_shows_a_reclaim_on_embedded_servers_results_on_stdout() -> None:
    done = run("demo", "--once", "--timeout", "60", env={}, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("[StreamReclaim] Reclaimed") == 3
    # stdout: the results only, the console's URL and the summary a final scan agrees with.
    url, summary = done.stdout.splitlines()
    assert re.fullmatch(r"Console: http://127\.0\.0\.1:\d+/ui", url), url
    assert summary == (
        "Demo done: 6 of 6 issues completed, all by builder-a-rig-agent-runtime-0; "
        '3 reclaimed from builder-b. Pending now: {"builders": 0}'
    )
    # The migrations' and the servers' chatter stays out of the way unless -v.
    assert "alembic" not in done.stderr and "pgserver" not in done.stderr, done.stderr[:3000]
    assert "Traceback" not in done.stderr


def test_serve_refuses_agent_auth_without_kubernetes(env: dict[str, str], tmp_path: Path) -> None:
    nowhere = {**env, "RIG_K8S_AGENT_AUTH": "true", "KUBECONFIG": str(tmp_path / "missing")}
    serve = run("serve", env={**nowhere, "RIG_HTTP_PORT": "1"})  # refused before it binds
    assert serve.returncode == 2, serve.stderr
    lines = serve.stderr.splitlines()
    refusal = [line for line in lines if "RIG_K8S_AGENT_AUTH=true, but" in line]
    assert len(refusal) == 1 and "no in-cluster configuration" in refusal[0]
    assert "Traceback" not in serve.stderr
