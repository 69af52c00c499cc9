"""An agent killed mid-entry, and the story the operator reads afterwards.

Real processes: `rig-conductor serve`, two `rig-conductor agent` processes, and the operator's
`rig-conductor work` command. The victim holds the one issue in a long build and is SIGKILLed;
the reaper moves the entry to the survivor, which finishes it. `GET /api/work/{issueId}` and
`rig-conductor work` then tell, in order: dispatched, started by the victim, reclaimed from the
victim to the survivor, started again, completed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.helpers import serve, wait_for

from .fleet import ONE_READ, Fleet, accepted_completions, conductor_env, dispatch, heard_from

pytestmark = pytest.mark.timeout(300)

VICTIM = ("builder-b", "builder-b-pod-0")
SURVIVOR = ("builder-a", "builder-a-pod-0")
STORY = ["DISPATCHED", "STARTED", "RECLAIMED", "STARTED", "COMPLETED"]


def told(timeline: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """The story's steps that matter here: kind, and who (the mover's target for a reclaim)."""
    steps = []
    for item in timeline:
        if item["kind"] in ("PROGRESS", "PUBLISHED"):
            continue
        steps.append((item["kind"], item.get("to") or item.get("consumer")))
    return steps


async def test_the_story_of_an_entry_whose_agent_was_killed(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    env = conductor_env([VICTIM[0], SURVIVOR[0]])
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            victim = fleet.start(*VICTIM, E2E_HOLD_FILE=str(hold), **ONE_READ)
            await wait_for(lambda: heard_from(api, victim.consumer), within=30)
            entry = await dispatch(api, "rc-1", {"title": "rc-1"})
            await wait_for(lambda: (out / f"holding-{victim.consumer}").exists(), within=15)
            survivor = fleet.start(*SURVIVOR)
            await wait_for(lambda: heard_from(api, survivor.consumer), within=30)
            victim.kill()

            async def completed() -> bool:
                return bool((await accepted_completions(engine)).get(entry))

            await wait_for(completed, within=40)
            fleet.stop_all()

        story = (await api.get("/api/work/rc-1")).json()
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        environment["RIG_CONDUCTOR_URL"] = conductor.url
        ran = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "rig_conductor", "work", "rc-1", "-o", "json"],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
        table = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "rig_conductor", "work", "rc-1"],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert story["entryId"] == entry and story["state"] == "done", story
    assert told(story["timeline"]) == [
        ("DISPATCHED", None),
        ("STARTED", victim.consumer),
        ("RECLAIMED", survivor.consumer),
        ("STARTED", survivor.consumer),
        ("COMPLETED", survivor.consumer),
    ], story["timeline"]
    moved = next(item for item in story["timeline"] if item["kind"] == "RECLAIMED")
    assert moved["from"] == victim.consumer and moved["reason"] in ("down", "stalled")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["timeline"] == story["timeline"]
    assert table.returncode == 0, table.stderr
    kinds = [line.split()[1] for line in table.stdout.splitlines() if line[:2].isdigit()]
    assert [k for k in kinds if k not in ("PROGRESS", "PUBLISHED")] == STORY
