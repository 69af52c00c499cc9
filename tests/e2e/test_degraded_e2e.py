"""Seed 001's incident end to end: review-e-codex hits its provider quota and keeps
heartbeating, degraded, while holding reviews; the healthy review-e consumers of the same group
take them over once the grace period has passed, and none waits for codex to recover.

Real processes: `rig-conductor serve`, and `rig-conductor agent` for codex and review-e. The
audit over the run (`rig-conductor audit`) finds nothing lost and nothing done twice.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.domain import ConsumerName
from rig_conductor.policy import degraded
from tests.integration.helpers import serve, wait_for

from .fleet import (
    AUDITED_TEST_S,
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    heard_from,
    pending,
    run_audit,
)

pytestmark = pytest.mark.timeout(AUDITED_TEST_S)  # it ends with a Spark audit

STREAM, GROUP = "assignments:review-e", "review"
CODEX = ("review-e-codex", "review-e-codex-rig-agent-runtime-0")
HEALTHY = [("review-e", f"review-e-rig-agent-runtime-{n}") for n in range(3)]
ISSUES = [f"rv-{n}" for n in range(1, 21)]
GRACE_S, SCAN_S = 1.5, 0.5
# How long codex's quota stays exhausted: every review must be done well before it recovers.
# (How soon after the grace they move is the reaper's timing, table-tested in policy; here,
# on a loaded machine, four agents' reads and handling can take any few seconds.)
DEGRADED_PAUSE_S = 600


async def first_degraded_heartbeat(engine: AsyncEngine, consumer: str) -> datetime:
    """The receipt of the first heartbeat of the consumer's degraded run (rule 3b's clock), as
    policy decides it from what PostgreSQL recorded."""
    beats = await queries.own_heartbeats(engine, tenant="default", consumers=[consumer])
    since = degraded.run_start(beats.get(ConsumerName(consumer)), None)
    assert since is not None, f"{consumer} is not degraded"
    return since


async def test_a_degraded_owner_loses_its_reviews_to_the_healthy_consumers(
    redis: Redis, engine: AsyncEngine, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    env = conductor_env(
        [CODEX[0], "review-e"],
        RIG_STREAMS="assignments:*",
        RIG_DISPATCH_STREAM=STREAM,
        RIG_AGENT_DOWN_MS="60000",
        RIG_DEGRADED_GRACE_MS=str(int(GRACE_S * 1000)),
        RIG_SCAN_INTERVAL_S=str(SCAN_S),
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        fleet_env = {"E2E_OUT_DIR": str(out), "E2E_WORK_S": "0.02"}
        with Fleet(redis_url, conductor.url, tmp_path, fleet_env) as fleet:
            where = {"stream": STREAM, "group": GROUP}
            # codex took the reviews while it was still healthy (and heard from: an agent never
            # heard from is down, and its stale entries would go to whichever healthy consumer
            # starts first, before codex could find out about its quota) ...
            beat = {"type": "HEARTBEAT", "agentId": CODEX[0], "consumer": CODEX[1]}
            assert (await api.post("/api/events", json=beat)).status_code == 202
            await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
            entries = {issue: await dispatch(api, issue, {"pr": issue}) for issue in ISSUES}
            await redis.xreadgroup(GROUP, CODEX[1], {STREAM: ">"}, count=len(ISSUES))
            # ... then its provider's quota ran out: every call now says Degraded.
            codex = fleet.start(
                *CODEX,
                **where,
                handler="tests.e2e.handlers:review",
                E2E_DEGRADED_CALLS="20",
                E2E_DEGRADED_PAUSE_S=str(DEGRADED_PAUSE_S),
            )
            healthy = [fleet.start(*agent, **where) for agent in HEALTHY]
            # Generous: four agent processes start at once, and a loaded CI machine is slow.
            for agent in healthy:
                await wait_for(lambda a=agent: heard_from(api, a.consumer), within=60)
            await wait_for(lambda: _flagged(api, CODEX[0]), within=60)

            async def settled() -> bool:
                done = await accepted_completions(engine, stream=STREAM)
                return set(entries.values()) <= set(done) and not await pending(redis, **where)

            await wait_for(settled, within=60)
            degraded_at = await first_degraded_heartbeat(engine, CODEX[1])
            assert codex.process.poll() is None  # alive and degraded all along
            codes = fleet.stop_all()
        assert "Scan failed" not in conductor.stderr, conductor.stderr[-3000:]

    assert set(codes.values()) == {0}, fleet.logs(codes, dict.fromkeys(codes, 0))
    completions = await accepted_completions(engine, stream=STREAM)
    healthy_names = {consumer for _, consumer in HEALTHY}
    for entry_id in entries.values():
        (done,) = completions[entry_id]  # exactly once
        assert done.consumer in healthy_names
        # Taken over once the grace had passed, and without waiting for codex to recover.
        waited = done.at - degraded_at
        assert timedelta(seconds=GRACE_S) <= waited < timedelta(seconds=DEGRADED_PAUSE_S), waited
    # Spread over the three healthy consumers, not piled onto one.
    by_consumer = {c: sum(d.consumer == c for (d,) in completions.values()) for c in healthy_names}
    assert min(by_consumer.values()) >= 4, by_consumer
    async with engine.connect() as conn:
        reasons = await conn.execute(
            select(events.c.detail["reason"].as_string()).where(events.c.kind == "RECLAIMED")
        )
        assert set(reasons.scalars()) == {"degraded"}

    summary = run_audit(database_url, redis_url, tmp_path / "audit")
    assert summary["lost"] == [] and summary["duplicates"] == []
    assert summary["completed"] == len(ISSUES)
    assert summary["reclaimsByReason"] == {"degraded": len(ISSUES)}


async def _flagged(api: httpx.AsyncClient, agent_id: str) -> bool:
    agents = (await api.get("/api/agents")).json()
    return any(a["agentId"] == agent_id and a["degraded"] for a in agents)
