"""A group that vanished under a running agent (Redis restarted empty, flushed, failed over to
an empty replica): the runtime creates it again from id 0, whatever `--start-id` said, with
its consumer, and reads on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from rig_conductor.agent import Entry
from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.settings import AgentSettings

from ..helpers import wait_for
from .harness import AGENT, ME, G, S, agent_of, dispatch, drained


async def test_a_vanished_group_is_created_again_from_0_and_read_on(
    redis: Redis,
    settings: Callable[..., AgentSettings],
    conductor: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="rig_conductor.agent")
    handled: list[str] = []

    def handle(entry: Entry) -> None:
        handled.append(entry.fields["issueId"])

    stop = asyncio.Event()
    client = ConductorClient(base_url=conductor, agent_id=AGENT, consumer=ME)
    agent = agent_of(
        handle,
        settings(),
        redis=redis,
        conductor=client,
        start_id="$",  # new entries only, at the first join
        stop=stop,
        block_ms=100,
    )
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: redis.exists(S))
        await dispatch(conductor, "rc-before")
        await wait_for(lambda: handled == ["rc-before"])
        await wait_for(lambda: drained(redis))

        # Redis loses everything, and an entry is appended (as the conductor appends the
        # unfinished dispatches again) before the runtime reads again: the stream is back, its
        # group is not. A group made again from `$` would skip the entry.
        async with redis.pipeline(transaction=True) as pipe:
            pipe.flushdb()
            pipe.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "rc-after", "agentId": AGENT})
            await pipe.execute()

        await wait_for(lambda: handled == ["rc-before", "rc-after"], within=30)
        await wait_for(lambda: drained(redis))
        (group,) = await redis.xinfo_groups(S)
        assert group["name"] == G
        assert [c["name"] for c in await redis.xinfo_consumers(S, G)] == [ME]
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await client.aclose()
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"Group {G} of {S} is gone" in m for m in messages)
    # Created twice in all: at start (from $), and once again after the loss (from 0).
    created = [m for m in messages if m.startswith(f"Created group {G} on {S}")]
    assert created == [f"Created group {G} on {S} from $", f"Created group {G} on {S} from 0"]
