"""The TypeScript runtime (`clients/typescript`, npm package `@rig-conductor/agent`) against real
servers: `rig-conductor serve`, Redis, PostgreSQL and `rig-agent` processes on Node. Issues are
completed exactly once with their staged outputs published; a SIGKILLed agent's entry is moved
by the reaper to a second TypeScript agent; a poison entry is dead-lettered through the
conductor (DEAD_LETTER); a Python and a TypeScript agent share one group and split the work;
the README's example runs from the packed tarball; the consumer-name lease is shared with the
Python runtime; the least-privilege agent user suffices. `test_typescript_agent_faults.py` has
the runtime's answers to faults.

Off CI a machine without Node skips; with CI set, that fails (`tests.needs`)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import redis_rights
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.agent.lease import lease_key
from tests.e2e.fleet import (
    GROUP,
    STREAM,
    Fleet,
    accepted_completions,
    calls,
    conductor_env,
    dead_letters,
    dispatch,
    effects,
    heard_from,
    pending,
    staged_leftovers,
    work_events,
)

from .helpers import serve, wait_for
from .restartable import RestartableRedis
from .ts_agent import (
    HANDLER,
    PACKAGE,
    WITHIN,
    assert_published_once,
    installed_fixture,  # noqa: F401 - the `installed` fixture
    rig_agent_fixture,  # noqa: F401 - the `rig_agent` fixture
    settled,
    start_ts,
)

pytestmark = pytest.mark.timeout(300)


async def test_a_typescript_agent_completes_each_issue_once_and_publishes_its_output(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    issues = [f"rc-{n}" for n in range(1, 7)]
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0")
            await wait_for(
                lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
            )
            entries = {issue: await dispatch(api, issue, {}) for issue in issues}
            await wait_for(
                lambda: settled(engine, redis, set(entries.values())),
                within=WITHIN,
                explain=fleet.tails,
            )
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    completions = await accepted_completions(engine)
    assert_published_once(out, completions, entries)
    for issue, entry in entries.items():
        assert effects(out)[issue]["consumer"] == agent.consumer
        assert calls(out, issue) == [f"{issue}.{agent.consumer}.a1"]
        kinds = [kind for kind, _, _ in await work_events(engine, entry)]
        assert kinds == ["WORK_STARTED", "WORK_COMPLETED", "WORK_PUBLISHED"], kinds
    # The consumer-name lease was released at the clean stop.
    assert await redis.exists(lease_key(agent.agent_id, STREAM, GROUP, agent.consumer)) == 0


async def test_a_sigkilled_typescript_agents_entry_is_moved_to_a_second_one(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    hold = tmp_path / "victim.hold"
    hold.touch()
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
            victim = start_ts(
                fleet, rig_agent, "builder", "builder-ts-victim", E2E_HOLD_FILE=str(hold)
            )
            await wait_for(
                lambda: heard_from(api, victim.consumer), within=WITHIN, explain=fleet.tails
            )
            entry = await dispatch(api, "rc-1", {})
            await wait_for(
                lambda: (out / f"holding-{victim.consumer}").exists(),
                within=WITHIN,
                explain=fleet.tails,
            )
            victim.kill()  # mid-entry: nothing completed, nothing acked, heartbeats stop
            assert await pending(redis) == {entry: victim.consumer}
            rescuer = start_ts(fleet, rig_agent, "builder", "builder-ts-rescuer")
            await wait_for(
                lambda: settled(engine, redis, {entry}), within=WITHIN, explain=fleet.tails
            )
            codes = fleet.stop_all()
    assert codes[rescuer.consumer] == 0, fleet.tails()
    completions = await accepted_completions(engine)
    assert [c.consumer for c in completions[entry]] == [rescuer.consumer]
    assert effects(out)["rc-1"]["consumer"] == rescuer.consumer
    assert staged_leftovers(out) == []
    # The victim started it once; the rescuer ran it once, as a later attempt.
    assert calls(out, "rc-1") == sorted(
        [f"rc-1.{victim.consumer}.a1", f"rc-1.{rescuer.consumer}.a{completions[entry][0].attempt}"]
    )
    assert completions[entry][0].attempt > 1


async def test_a_poison_entry_is_dead_lettered_through_the_conductor(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    limit = {"RIG_MAX_DELIVERIES": "3"}
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"], **limit)) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out), **limit}) as fleet:
            agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0")
            await wait_for(
                lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
            )
            poison = await dispatch(api, "rc-7", {"poison": True})
            healthy = await dispatch(api, "rc-8", {})

            async def done() -> bool:
                letters = await dead_letters(redis)
                return poison in letters and await settled(engine, redis, {healthy})

            await wait_for(done, within=WITHIN, explain=fleet.tails)
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    letters = await dead_letters(redis)
    assert list(letters) == [poison]
    letter = letters[poison]
    assert (letter["stream"], letter["group"], letter["issueId"]) == (STREAM, GROUP, "rc-7")
    assert letter["reason"] == "max-deliveries" and letter["consumer"] == agent.consumer
    assert letter["type"] == "ISSUE_ASSIGNED" and json.loads(letter["payload"]) == {"poison": True}
    # The agent asked for it (DEAD_LETTER), after running it RIG_MAX_DELIVERIES times.
    async with engine.connect() as conn:
        asked = [
            row.detail.get("askedBy")
            for row in await conn.execute(
                select(events.c.detail).where(
                    events.c.kind == "DEAD_LETTERED", events.c.entry_id == poison
                )
            )
        ]
    assert asked == [agent.consumer]
    assert len(calls(out, "rc-7")) == 3
    kinds = [kind for kind, _, _ in await work_events(engine, poison)]
    assert kinds == ["WORK_STARTED", "WORK_FAILED"] * 3
    assert sorted(effects(out)) == ["rc-8"]


async def test_a_python_and_a_typescript_agent_share_one_group(
    rig_agent: list[str],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    issues = [f"rc-{n}" for n in range(1, 17)]
    env = {"E2E_OUT_DIR": str(out), "E2E_WORK_S": "0.3"}
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, env) as fleet:
            python = fleet.start("builder", "builder-py-0")
            node = start_ts(fleet, rig_agent, "builder", "builder-ts-0")
            for agent in (python, node):
                await wait_for(
                    lambda: heard_from(api, agent.consumer),  # noqa: B023
                    within=WITHIN,
                    explain=fleet.tails,
                )
            entries = {issue: await dispatch(api, issue, {}) for issue in issues}
            await wait_for(
                lambda: settled(engine, redis, set(entries.values())),
                within=WITHIN,
                explain=fleet.tails,
            )
            codes = fleet.stop_all()
    assert codes == {python.consumer: 0, node.consumer: 0}, fleet.tails()
    completions = await accepted_completions(engine)
    assert_published_once(out, completions, entries)
    by = {effects(out)[issue]["consumer"] for issue in issues}
    assert by == {python.consumer, node.consumer}, "both runtimes took a share of the work"


def test_the_lease_is_the_python_runtimes(rig_agent: list[str]) -> None:
    """Same key and scripts as `rig_conductor.agent.lease` (its scripts in `adapters.redis.lua`),
    so the two runtimes exclude each other on one consumer name."""
    from rig_conductor.adapters.redis import lua
    from rig_conductor.agent import lease

    source = (PACKAGE / "src" / "lease.ts").read_text()
    assert lua.LEASE_RENEW in source and lua.LEASE_RELEASE in source
    assert "`${agentPrefix(agentId)}lease:${stream}:${group}:${consumer}`" in source
    assert lease.lease_key("a", "s", "g", "c") == "rig:agent:a:lease:s:g:c"
    assert sys.executable  # the Python side runs in this interpreter


async def test_the_readme_example_runs_from_the_installed_tarball(
    installed: Path,
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    reports = tmp_path / "reports"
    issues = ["rc-1", "rc-2", "rc-3"]
    async with (
        serve(redis_url, database_url, **conductor_env(["builder"])) as conductor,
        httpx.AsyncClient(base_url=conductor.url) as api,
    ):
        with Fleet(redis_url, conductor.url, tmp_path, {"REPORTS_DIR": str(reports)}) as fleet:
            agent = start_ts(
                fleet,
                [str(installed / "node_modules" / ".bin" / "rig-agent")],
                "builder",
                "builder-readme-0",
                handler="./handler.mjs",
                cwd=installed,
            )
            await wait_for(
                lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
            )
            entries = {issue: await dispatch(api, issue, {"n": issue}) for issue in issues}
            await wait_for(
                lambda: settled(engine, redis, set(entries.values())),
                within=WITHIN,
                explain=fleet.tails,
            )
            codes = fleet.stop_all()
    assert codes == {agent.consumer: 0}, fleet.tails()
    assert sorted(p.name for p in reports.iterdir()) == [f"{issue}.json" for issue in issues]
    for issue in issues:
        report = json.loads((reports / f"{issue}.json").read_text())
        assert report == {
            "issue": issue,
            "payload": {"n": issue},
            "attempt": 1,
            "by": agent.consumer,
        }


async def test_one_consumer_name_is_refused_across_the_two_runtimes(
    rig_agent: list[str], redis: Redis, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    """The consumer-name lease is the Python runtime's: a TypeScript agent with a live Python
    agent's name exits 2 with one line, and a Python agent with a live TypeScript one's name
    too."""
    async with serve(redis_url, database_url, **conductor_env(["builder"])) as conductor:
        with Fleet(redis_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(tmp_path)}) as fleet:
            python = fleet.start("builder", "builder-shared")
            node = start_ts(fleet, rig_agent, "builder", "builder-other", log_name="ts-other")
            for holder in (python, node):
                key = lease_key(holder.agent_id, STREAM, GROUP, holder.consumer)
                await wait_for(lambda: redis.exists(key), within=WITHIN, explain=fleet.tails)  # noqa: B023
            second_node = start_ts(
                fleet, rig_agent, "builder", "builder-shared", log_name="ts-shared-2"
            )
            second_python = fleet.start("builder", "builder-other")
            for second in (second_node, second_python):
                assert second.process.wait(timeout=WITHIN) == 2, second.output()
            assert python.process.poll() is None and node.process.poll() is None
    refusal = [line for line in second_node.output().splitlines() if "Refusing" in line]
    assert len(refusal) == 1 and "consumer name in use by another live process" in refusal[0]
    assert "consumer name in use" in second_python.output()


def test_a_bad_setting_is_one_line_naming_it(rig_agent: list[str], tmp_path: Path) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment["RIG_HEARTBEAT_INTERVAL_S"] = "-1"
    done = subprocess.run(
        [*rig_agent, "--agent-id", "builder", "--group", GROUP, "--handler", str(HANDLER)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        'rig-agent: RIG_HEARTBEAT_INTERVAL_S: must be greater than 0 (got "-1")'
    ]


async def test_the_least_privilege_agent_user_suffices(
    rig_agent: list[str],
    restartable_redis: RestartableRedis,
    database_url: str,
    engine: AsyncEngine,
    tmp_path: Path,
) -> None:
    """The agent's Redis user exactly as `rig-conductor redis-acl` prints it:
    the agent runs its entries, and a second process with its consumer name waits for the
    lease with what that user may run, then is refused (exit 2)."""
    out = tmp_path / "out"
    admin = Redis.from_url(restartable_redis.url, decode_responses=True)
    async with contextlib.aclosing(admin):
        rules = redis_rights.agent_rules("builder", [STREAM])
        await admin.execute_command(
            "ACL", "SETUSER", "rig-agent-builder", *rules.split(), "on", ">agent-pw"
        )
        agent_url = restartable_redis.url.replace(
            "redis://", "redis://rig-agent-builder:agent-pw@", 1
        )
        async with (
            serve(restartable_redis.url, database_url, **conductor_env(["builder"])) as conductor,
            httpx.AsyncClient(base_url=conductor.url) as api,
        ):
            with Fleet(agent_url, conductor.url, tmp_path, {"E2E_OUT_DIR": str(out)}) as fleet:
                agent = start_ts(fleet, rig_agent, "builder", "builder-ts-0")
                await wait_for(
                    lambda: heard_from(api, agent.consumer), within=WITHIN, explain=fleet.tails
                )
                entries = {issue: await dispatch(api, issue, {}) for issue in ("rc-1", "rc-2")}
                await wait_for(
                    lambda: settled(engine, admin, set(entries.values())),
                    within=WITHIN,
                    explain=fleet.tails,
                )
                second = start_ts(fleet, rig_agent, "builder", "builder-ts-0", log_name="second")
                assert second.process.wait(timeout=WITHIN) == 2, second.output()
                fleet.stop_all()
    assert agent.process.returncode == 0, fleet.tails()
    assert "consumer name in use by another live process" in second.output()
    assert "NOPERM" not in agent.output() + second.output()
    assert sorted(effects(out)) == ["rc-1", "rc-2"]
