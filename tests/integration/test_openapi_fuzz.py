"""schemathesis against a running `serve`: generated requests from /openapi.json must never
produce a 5xx or a response that breaks the published schema."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from .helpers import serve

# 60 examples of every operation take about a minute on an idle machine; give a loaded one room.
pytestmark = pytest.mark.timeout(900)

CHECKS = ",".join(
    [
        "not_a_server_error",
        "response_schema_conformance",
        "status_code_conformance",
        "content_type_conformance",
    ]
)


async def test_generated_requests_find_no_server_error(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
    async with serve(
        redis_url,
        database_url,
        RIG_STARTUP_DELAY_S="0",
        RIG_SCAN_INTERVAL_S="1",
        RIG_AGENT_IDS="dev-e",
    ) as conductor:
        run = await asyncio.to_thread(
            subprocess.run,
            [
                cli,
                "run",
                f"{conductor.url}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "60",
                "--seed",
                "20261121",
                "--request-timeout",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
    assert run.returncode == 0, run.stdout[-6000:]
    assert "Traceback" not in conductor.stderr
