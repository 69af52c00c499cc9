"""A WORK_COMPLETED the conductor accepted but whose answer was lost (the conductor stopped, the
connection broke): the runtime's retry is answered 409 `done` for its own attempt, and the
attempt's staged files are committed and the entry acked, not discarded. Real Redis; the
conductor is httpx's MockTransport behind the runtime's own client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
from redis.asyncio import Redis

from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.settle import Settler
from rig_conductor.agent.staging import Staging

from .harness import AGENT, ME, G, S


async def test_a_retried_completion_that_was_accepted_commits_its_files(
    redis: Redis, tmp_path: Path
) -> None:
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    entry_id = await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": "rc-1"})
    await redis.xreadgroup(G, ME, {S: ">"})
    area = Staging(entry_id=entry_id, attempt=1)
    final = tmp_path / "rc-1.json"
    area.stage(final).write_text("effect")
    files = area.close()

    sent: list[str] = []

    def conductor(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content)["type"])
        if len(sent) == 1:  # recorded as done, then the conductor stopped before answering
            raise httpx.ReadError("connection closed", request=request)
        if sent[-1] == "WORK_PUBLISHED":
            return httpx.Response(202, json={"accepted": True, "attempt": 1, "state": "done"})
        body = {"attempt": 1, "state": "done", "detail": "fenced: the entry is already done"}
        return httpx.Response(409, json=body)

    client = ConductorClient(
        base_url="http://conductor",
        agent_id=AGENT,
        consumer=ME,
        transport=httpx.MockTransport(conductor),
    )
    settler = Settler(
        redis=redis,
        conductor=client,
        stream=S,
        group=G,
        consumer=ME,
        stop=asyncio.Event(),
        on_conductor_down=lambda: None,
    )
    try:
        outcome = await settler.complete(entry_id, "rc-1", 1, files)
    finally:
        await client.aclose()
    assert sent == ["WORK_COMPLETED", "WORK_COMPLETED", "WORK_PUBLISHED"]
    assert outcome.startswith("completed"), outcome
    assert final.read_text() == "effect"
    assert (await redis.xpending(S, G))["pending"] == 0
