"""Finishing an accepted attempt when Redis fails at that moment (restarted empty, say): the
attempt's own staged files are committed all the same. Redis is a real client of a port where
nothing listens; the conductor is never asked."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.settle import Settler
from rig_conductor.agent.staging import Staging


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_accepted_attempts_files_are_committed_before_redis_is_asked(
    tmp_path: Path,
) -> None:
    area = Staging(entry_id="1-0", attempt=2)
    final = tmp_path / "rc-1.json"
    area.stage(final).write_text("effect")
    files = area.close()
    redis = Redis(port=closed_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    conductor = ConductorClient(base_url="http://127.0.0.1:9", agent_id="dev-e", consumer="dev-e-0")
    settler = Settler(
        redis=redis,
        conductor=conductor,
        stream="rig:dispatch",
        group="builders",
        consumer="dev-e-0",
        stop=asyncio.Event(),
        on_conductor_down=lambda: None,
    )
    try:
        with pytest.raises(RedisError):  # the entry stays pending: acked when Redis is back
            await settler.finish("1-0", 2, files)
    finally:
        await redis.aclose()
        await conductor.aclose()
    assert final.read_text() == "effect"
    assert not files[0].tmp.exists()
