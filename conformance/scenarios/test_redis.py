"""The Redis side: a worn-out entry is dead-lettered through the conductor, a vanished group is
created again, one consumer name is one process, and the agent's least-privilege Redis user is
all an agent needs."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from redis.asyncio import Redis
from tests.integration.restartable import RestartableRedis
from tests.topologies.servers import REDIS_SERVER, free_ports, require_binaries

from conformance import kit
from conformance.kit import GROUP, STREAM, WITHIN, A, Opener

pytestmark = pytest.mark.timeout(240)


async def test_a_poison_entry_is_dead_lettered_with_its_fields(world: Opener) -> None:
    """RIG_MAX_DELIVERIES is 3: three calls, then the agent asks the conductor (DEAD_LETTER)
    for the copy reaper step 7 makes, and the entry leaves the pending list."""
    async with world() as w:
        agent = w.start(A)
        await w.ready(agent)
        poison = await w.dispatch("rc-7", {"fail": True})
        healthy = await w.dispatch("rc-8")

        async def settled() -> bool:
            return poison in await w.dead_letters() and await w.finished(healthy)

        await w.until(settled)
        assert w.stop_all() == {A: 0}, w.tails()
    letter = (await w.dead_letters())[poison]
    assert (letter["stream"], letter["group"], letter["consumer"]) == (STREAM, GROUP, A)
    assert letter["reason"] == "max-deliveries" and int(letter["deliveries"]) >= 3
    assert (letter["type"], letter["issueId"], letter["agentId"]) == (
        "ISSUE_ASSIGNED",
        "rc-7",
        "conf",
    )
    assert json.loads(letter["payload"]) == {"fail": True} and letter["assignedAt"]
    assert w.calls("rc-7") == [f"{A}.a1", f"{A}.a2", f"{A}.a3"]
    assert [r.kind for r in await w.reports(poison)] == ["WORK_STARTED", "WORK_FAILED"] * 3
    assert await w.asked_for_dead_letter(poison) == [A]
    assert await w.pending() == {}


async def test_a_vanished_group_is_created_again(world: Opener) -> None:
    """The group is destroyed under a running agent (as when Redis restarts empty): the agent
    creates it again from id 0 and reads on. Reading from 0 meets the entries it finished
    before; they are done, so it acknowledges them without running them again."""
    async with world() as w:
        agent = w.start(A)
        await w.ready(agent)
        before = await w.dispatch("rc-1")
        await w.until(lambda: w.finished(before))
        assert await w.redis.xgroup_destroy(STREAM, GROUP) == 1
        after = await w.dispatch("rc-2")
        await w.until(lambda: w.finished(after))

        async def caught_up() -> bool:
            groups = {g["name"]: g for g in await w.redis.xinfo_groups(STREAM)}
            return (
                GROUP in groups
                and groups[GROUP]["pending"] == 0
                and groups[GROUP]["last-delivered-id"] == after
            )

        await w.until(caught_up)
        consumers = [c["name"] for c in await w.redis.xinfo_consumers(STREAM, GROUP)]
        assert w.stop_all() == {A: 0}, w.tails()
    assert consumers == [A]
    assert w.calls("rc-1") == [f"{A}.a1"]
    assert w.calls("rc-2") == [f"{A}.a1"]
    assert len(await w.completed(before)) == 1 and len(await w.completed(after)) == 1


async def test_two_processes_with_one_consumer_name_are_refused(world: Opener) -> None:
    async with world() as w:
        first = w.start(A)
        await w.ready(first)
        second = w.start(A, log_name="second")
        code = second.process.wait(timeout=WITHIN)
        assert code != 0, second.output()
        assert first.process.poll() is None, "the first process must keep running"
        entry_id = await w.dispatch("rc-1")
        await w.until(lambda: w.finished(entry_id))
        assert first.stop() == 0, w.tails()
    assert w.calls("rc-1") == [f"{A}.a1"]


async def test_a_least_privilege_agent_user_suffices(
    world: Opener, redis: Redis, tmp_path: Path
) -> None:
    """The agent signs in as its user from `rig-conductor redis-acl`: it may read its stream
    with its group, acknowledge and keep its own keys, nothing more. Everything an agent does
    still works: work, progress, a dead letter (asked of the conductor), the lease."""
    if await kit.supports_selectors(redis):
        server = None  # every scenario signs agents in as that user already
    else:  # the embedded Redis 6.2 has no ACL selectors: a Redis 7 of the scenario's own
        require_binaries(REDIS_SERVER)
        server = RestartableRedis(free_ports(1)[0], tmp_path / "redis7").start()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if server is None:
                opened = world()
            else:
                admin = Redis.from_url(server.url, decode_responses=True)
                stack.push_async_callback(admin.aclose)
                opened = world(redis_url=server.url, admin=admin)
            w = await stack.enter_async_context(opened)
            assert "@" in w.agent_redis_url, "the agent signs in as its own user"
            agent = w.start(A)
            await w.ready(agent)
            entries = [
                await w.dispatch("rc-1"),
                await w.dispatch("rc-2", {"workS": 1, "progressS": 0.2}),
            ]
            poison = await w.dispatch("rc-3", {"fail": True})

            async def settled() -> bool:
                return poison in await w.dead_letters() and await w.finished(*entries)

            await w.until(settled)
            assert await w.lease_held(A)
            assert w.stop_all() == {A: 0}, w.tails()
            output = agent.output()
            assert await w.asked_for_dead_letter(poison) == [A]
    finally:
        if server is not None:
            server.stop()
    assert "NOPERM" not in output, output[-3000:]
    assert (w.effect("rc-1") or {}).get("consumer") == A
    assert (w.effect("rc-2") or {}).get("consumer") == A
