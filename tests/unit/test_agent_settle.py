"""Publishing an accepted attempt when the conductor and Redis fail at that moment: the
attempt's own staged files are renamed all the same, and the entry is not acked while the
publish is not recorded (the record in PostgreSQL has the next holder finish it). Redis is a
real client of a port where nothing listens; so is the conductor."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.settle import Settler
from rig_conductor.agent.staging import Staging


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_an_accepted_attempts_files_are_renamed_before_anyone_is_asked(
    tmp_path: Path,
) -> None:
    area = Staging(entry_id="1-0", attempt=2)
    final = tmp_path / "rc-1.json"
    area.stage(final).write_text("effect")
    files = area.close()
    redis = Redis(port=closed_port(), socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))
    conductor = ConductorClient(
        base_url=f"http://127.0.0.1:{closed_port()}", agent_id="dev-e", consumer="dev-e-0"
    )
    stop = asyncio.Event()
    stop.set()  # one last try of WORK_PUBLISHED, no retries
    settler = Settler(
        redis=redis,
        conductor=conductor,
        stream="rig:dispatch",
        group="builders",
        consumer="dev-e-0",
        stop=stop,
        on_conductor_down=lambda: None,
    )
    try:
        outcome = await settler.publish("1-0", "rc-1", 2, files)
    finally:
        await redis.aclose()
        await conductor.aclose()
    assert final.read_text() == "effect"
    assert not files[0].tmp.exists()
    # Not acked (Redis was never asked: it would have raised): the next holder publishes again.
    assert "WORK_PUBLISHED not recorded" in outcome and "not acked" in outcome
