"""The TypeScript runtime's answers to faults, against real servers and `rig-agent` processes:
SIGTERM finishes the entry in hand and exits 0, a second one gives it up; a vanished group
(NOGROUP) is created again; a handler hung past RIG_ENTRY_DEADLINE_MS is abandoned and its entry
moved by the reaper, while the agent keeps its liveness and its other work; a handler that
throws `Degraded` pauses its agent, whose entries go to a healthy one; Redis restarted empty
fences the entry in hand off, and its dispatch, appended again, runs and publishes once.

Off CI a machine without Node skips; with CI set, that fails (`tests.needs`)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import assignments, dispatches, events, redis_epochs
from rig_conductor.agent.lease import lease_key
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    Fleet,
    accepted_completions,
    conductor_env,
    dispatch,
    effects,
    heard_from,
    pending,
    staged_leftovers,
    work_events,
)

from .helpers import serve, wait_for
from .restartable import RestartableRedis
from .ts_agent import HANDLER, WITHIN, rig_agent_fixture, settled, start_ts  # noqa: F401

pytestmark = pytest.mark.timeout(300)


async def test_sigterm_finishes_the_entry_in_hand_and_exits_0(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    hold.touch()
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0", E2E_HOLD_FILE=str(hold))
            await wait_for(
                lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
            )
            entry = await dispatch(api, "rc-1", {})
            await wait_for(
                lambda: (out / f"holding-{agent.consumer}").exists(),
                within=WITHIN,
                explain=fleet.tails,
            )
            agent.terminate()
            await wait_for(
                lambda: "SIGTERM received" in agent.output(), within=WITHIN, explain=fleet.tails
            )
            hold.unlink()  # the work in hand ends within the grace period
            assert agent.process.wait(timeout=WITHIN) == 0, agent.output()
    assert [c.consumer for c in (await accepted_completions(engine))[entry]] == [agent.consumer]
    assert sorted(effects(out)) == ["rc-1"]
    assert await pending(redis) == {}
    assert await redis.exists(lease_key(agent.agent_id, STREAM, GROUP, agent.consumer)) == 0


async def test_a_second_sigterm_abandons_the_entry_in_hand(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    hold.touch()
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0", E2E_HOLD_FILE=str(hold))
            await wait_for(lambda: heard_from(api, agent.consumer), within=WITHIN)
            entry = await dispatch(api, "rc-1", {})
            await wait_for(
                lambda: (out / f"holding-{agent.consumer}").exists(),
                within=WITHIN,
                explain=fleet.tails,
            )
            agent.terminate()
            await wait_for(lambda: "SIGTERM received" in agent.output(), within=WITHIN)
            agent.process.send_signal(signal.SIGTERM)  # the handler never ends: give it up
            assert agent.process.wait(timeout=WITHIN) == 0, agent.output()
    assert "SIGTERM again: abandoning the current entry" in agent.output()
    assert await pending(redis) == {entry: agent.consumer}  # left pending, for the reaper
    assert entry not in await accepted_completions(engine)
    assert effects(out) == {} and staged_leftovers(out) == []
    assert await redis.exists(lease_key(agent.agent_id, STREAM, GROUP, agent.consumer)) == 0


async def test_a_vanished_group_is_created_again_and_read_on(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0", RIG_SCAN_INTERVAL_S="0.5")
            await wait_for(
                lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
            )
            first = await dispatch(api, "rc-1", {})
            await wait_for(
                lambda: settled(engine, redis, {first}), within=WITHIN, explain=fleet.tails
            )
            await redis.delete(STREAM)  # the stream and its groups are gone: NOGROUP
            await wait_for(lambda: "is gone" in agent.output(), within=WITHIN, explain=fleet.tails)
            second = await dispatch(api, "rc-2", {})
            await wait_for(
                lambda: settled(engine, redis, {second}), within=WITHIN, explain=fleet.tails
            )
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    assert sorted(effects(out)) == ["rc-1", "rc-2"]


async def test_a_hung_handler_is_abandoned_at_its_deadline_and_its_entry_moved(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    deadline = {"RIG_ENTRY_DEADLINE_MS": "2000"}
    env = conductor_env(["builder-h", "builder-a"], RIG_AGENT_DOWN_MS="60000", **deadline)
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        fleet_env = {"E2E_OUT_DIR": str(out), "E2E_HANG_FILE": str(hold), **deadline}
        with Fleet(redis_url, conductor.url, tmp_path, fleet_env) as fleet:
            hung = start_ts(
                fleet,
                rig_agent,
                "builder-h",
                "builder-h-pod-0",
                handler=f"{HANDLER}#hang",
                E2E_HANG_ISSUES="rc-hung",
            )
            await wait_for(lambda: heard_from(api, hung.consumer), within=WITHIN)
            stuck = await dispatch(api, "rc-hung", {})
            await wait_for(
                lambda: (out / f"hanging-{hung.consumer}").exists(),
                within=WITHIN,
                explain=fleet.tails,
            )
            healthy = start_ts(fleet, rig_agent, "builder-a", "builder-a-pod-0")
            await wait_for(
                lambda: settled(engine, redis, {stuck}), within=WITHIN, explain=fleet.tails
            )
            # The hung agent is alive and keeps its other work.
            others = {f"rc-{n}": await dispatch(api, f"rc-{n}", {}) for n in range(1, 5)}
            await wait_for(
                lambda: settled(engine, redis, set(others.values())),
                within=WITHIN,
                explain=fleet.tails,
            )
            hold.unlink()  # the hung call returns at last: too late to count
            await wait_for(
                lambda: (out / "calls" / f"rc-hung.{hung.consumer}.a1").exists(), within=WITHIN
            )
            codes = fleet.stop_all()
    assert codes == {hung.consumer: 0, healthy.consumer: 0}, fleet.tails()
    assert "Abandoned entry " + stuck in hung.output()
    completions = await accepted_completions(engine)
    assert [c.consumer for c in completions[stuck]] == [healthy.consumer]
    assert effects(out)["rc-hung"]["consumer"] == healthy.consumer
    reports = await work_events(engine, stuck)
    # Attempt 1 was given up: WORK_FAILED (fenced if the reaper, on the same deadline, moved the
    # entry first), and never completed.
    first = [(kind, fenced) for kind, attempt, fenced in reports if attempt == 1]
    assert first[0] == ("WORK_STARTED", False) and [k for k, _ in first[1:]] == ["WORK_FAILED"]
    assert staged_leftovers(out) == []


async def test_a_degraded_agent_reads_nothing_and_its_entries_move(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    codex = ("review-e-codex", "review-e-codex-rig-agent-runtime-0")
    env = conductor_env(
        [codex[0], "review-e"], RIG_AGENT_DOWN_MS="60000", RIG_DEGRADED_GRACE_MS="1500"
    )
    async with (
        serve(redis_url, database_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            # codex took the reviews while still healthy (and heard from) ...
            beat = {"type": "HEARTBEAT", "agentId": codex[0], "consumer": codex[1]}
            assert (await api.post("/api/events", json=beat)).status_code == 202
            await redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
            entries = {f"rv-{n}": await dispatch(api, f"rv-{n}", {}) for n in range(1, 7)}
            await redis.xreadgroup(GROUP, codex[1], {STREAM: ">"}, count=len(entries))
            # ... then its provider's quota ran out: every call throws Degraded.
            degraded = start_ts(
                fleet,
                rig_agent,
                *codex,
                handler=f"{HANDLER}#review",
                E2E_DEGRADED_CALLS="100",
                E2E_DEGRADED_PAUSE_S="600",
            )

            async def flagged() -> bool:
                agents = (await api.get("/api/agents")).json()
                return any(a["agentId"] == codex[0] and a["degraded"] for a in agents)

            await wait_for(flagged, within=WITHIN, explain=fleet.tails)
            healthy = start_ts(fleet, rig_agent, "review-e", "review-e-rig-agent-runtime-0")
            await wait_for(
                lambda: settled(engine, redis, set(entries.values())),
                within=WITHIN,
                explain=fleet.tails,
            )
            assert degraded.process.poll() is None  # alive and degraded all along
            codes = fleet.stop_all()
    assert codes == {degraded.consumer: 0, healthy.consumer: 0}, fleet.tails()
    completions = await accepted_completions(engine)
    assert {c.consumer for e in entries.values() for c in completions[e]} == {healthy.consumer}
    assert all(len(completions[e]) == 1 for e in entries.values())
    # It ran one entry, threw Degraded, and read nothing more while paused.
    calls = sorted(p.name for p in (out / "calls").iterdir() if degraded.consumer in p.name)
    assert calls == []  # `review` throws before `build` leaves its marker
    async with engine.connect() as conn:
        failures = (
            (
                await conn.execute(
                    select(events.c.detail["error"].as_string()).where(
                        events.c.kind == "WORK_FAILED", events.c.consumer == degraded.consumer
                    )
                )
            )
            .scalars()
            .all()
        )
    assert len(failures) == 1 and failures[0].startswith("degraded: codex_quota_exhausted_until_")
    assert await pending(redis) == {}


async def test_redis_restarted_empty_fences_the_entry_in_hand_and_runs_its_dispatch_again(
    rig_agent: list[str],
    restartable_redis: RestartableRedis,
    database_url: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    out, hold = tmp_path / "out", tmp_path / "hold"
    hold.touch()
    redis = Redis.from_url(restartable_redis.url, decode_responses=True)
    async with (
        contextlib.aclosing(redis),
        serve(restartable_redis.url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        env = {"E2E_OUT_DIR": str(out)}
        with Fleet(restartable_redis.url, conductor.url, tmp_path, env) as fleet:

            async def epoch_remembered() -> bool:
                async with engine.connect() as conn:
                    return await conn.scalar(select(func.count()).select_from(redis_epochs)) == 1

            await wait_for(epoch_remembered, within=WITHIN)  # the first scan has looked
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0", E2E_HOLD_FILE=str(hold))
            await wait_for(lambda: heard_from(api, agent.consumer), within=WITHIN)
            lost = await dispatch(api, "rc-1", {})
            await wait_for(
                lambda: (out / f"holding-{agent.consumer}").exists(),
                within=WITHIN,
                explain=fleet.tails,
            )
            restartable_redis.restart_empty()

            async def superseded() -> bool:
                async with engine.connect() as conn:
                    state = await conn.scalar(
                        select(assignments.c.state).where(assignments.c.entry_id == lost)
                    )
                return state == "superseded"

            await wait_for(superseded, within=WITHIN, explain=fleet.tails)
            hold.unlink()  # the entry in hand finishes: its completion is fenced off

            async def done_again() -> bool:
                async with engine.connect() as conn:
                    now = await conn.scalar(
                        select(dispatches.c.entry_id).where(dispatches.c.idempotency_key == "rc-1")
                    )
                if now == lost or now not in await accepted_completions(engine):
                    return False
                try:
                    return await pending(redis) == {}
                except Exception:  # the group is not there again yet
                    return False

            await wait_for(done_again, within=WITHIN, explain=fleet.tails)
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    assert "fenced at completion" in agent.output()
    assert "is gone" in agent.output()
    completions = await accepted_completions(engine)
    assert lost not in completions and len(completions) == 1
    (now,) = completions
    assert effects(out)["rc-1"]["entryId"] == now  # the new entry's output, the old one's discarded
    assert staged_leftovers(out) == []
