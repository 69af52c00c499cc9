"""The console's operator powers over the API: a group's pending entries, moves by hand through
the console's guarded move, the reclaim history, dead letters many at a time."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings

from .console_kit import OPERATOR, VIEWER, G, S, builder, client_of, stuck
from .helpers import owners, register

AS_VIEWER = {"Authorization": f"Bearer {VIEWER}"}
AS_OPERATOR = {"Authorization": f"Bearer {OPERATOR}"}


async def test_pending_moves_and_reclaims(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    app: FastAPI = builder(make_settings)()
    async for client in client_of(app):
        held = await stuck(redis, client, 5)
        pending = await client.get(f"/api/streams/{S}/groups/{G}/pending", headers=AS_VIEWER)
        assert pending.status_code == 200, pending.text
        rows = pending.json()
        assert [r["entryId"] for r in rows] == held
        assert {r["consumer"] for r in rows} == {"dev-e-0"}
        assert [r["issueId"] for r in rows] == [f"rc-{i}" for i in range(1, 6)]
        assert all(r["deliveries"] == 1 and r["idleMs"] >= 0 for r in rows)
        page = await client.get(f"/api/streams/{S}/groups/{G}/pending?limit=2", headers=AS_VIEWER)
        assert [r["entryId"] for r in page.json()] == held[:2]
        assert 'rel="next"' in page.headers["link"]
        nxt = await client.get(
            f"/api/streams/{S}/groups/{G}/pending?limit=2&after={held[1]}", headers=AS_VIEWER
        )
        assert [r["entryId"] for r in nxt.json()] == held[2:4]
        mine = await client.get(
            f"/api/streams/{S}/groups/{G}/pending?consumer=qa-e-0", headers=AS_VIEWER
        )
        assert mine.json() == []
        nogroup = await client.get(f"/api/streams/{S}/groups/nope/pending", headers=AS_VIEWER)
        assert nogroup.status_code == 404

        body = {"stream": S, "group": G, "entryIds": [*held[:2], "1-1"], "to": "qa-e-0"}
        assert (await client.post("/api/moves", json=body, headers=AS_VIEWER)).status_code == 403
        moved = await client.post("/api/moves", json=body, headers=AS_OPERATOR)
        assert moved.status_code == 200, moved.text
        assert moved.json()["moved"] == held[:2]
        assert moved.json()["skipped"] == [{"entryId": "1-1", "why": "not pending in the group"}]
        assert [owner for _, owner in sorted((await owners(redis, S, G)).items())] == [
            "qa-e-0",
            "qa-e-0",
            "dev-e-0",
            "dev-e-0",
            "dev-e-0",
        ]

        # dev-e never heartbeated: its consumers are down, and rule 5 would not pick one.
        await register(redis, S, G, "dev-e-1")
        refused = await client.post(
            "/api/moves",
            json={"stream": S, "group": G, "entryIds": held[2:], "to": "dev-e-1"},
            headers=AS_OPERATOR,
        )
        assert refused.status_code == 409, refused.text
        assert "dev-e-1" in refused.json()["detail"]
        assert set((await owners(redis, S, G)).values()) == {"qa-e-0", "dev-e-0"}

        history = (await client.get("/api/reclaims", headers=AS_VIEWER)).json()
        assert len(history) == 1
        (one,) = history
        assert (one["from"], one["to"], one["reason"]) == ("dev-e-0", "qa-e-0", "manual")
        assert one["entryIds"] == held[:2] and one["stream"] == S and one["group"] == G
        assert one["by"]
        down = await client.get("/api/reclaims?reason=down", headers=AS_VIEWER)
        assert down.json() == []
        older = await client.get(f"/api/reclaims?after={one['id']}", headers=AS_VIEWER)
        assert older.json() == []


async def test_dead_letters_many_at_once(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> None:
    app: FastAPI = builder(make_settings)(max_deliveries=1)
    async for client in client_of(app):
        await stuck(redis, client, 5)
        scan = await client.post("/api/reaper/scan?dryRun=false", headers=AS_OPERATOR)
        assert scan.json()["deadLettered"] == 5, scan.text
        letters = (await client.get("/api/deadletters", headers=AS_VIEWER)).json()
        ids = [letter["dlqId"] for letter in letters]
        assert len(ids) == 5

        two = {"stream": S, "dlqIds": ids[:2]}
        refused = await client.post("/api/deadletters/requeue", json=two, headers=AS_VIEWER)
        assert refused.status_code == 403
        requeued = await client.post("/api/deadletters/requeue", json=two, headers=AS_OPERATOR)
        assert requeued.status_code == 200, requeued.text
        assert requeued.json() == {"stream": S, "requeued": 2}

        match = {"stream": S, "match": {"text": "rc-"}}
        deleted = await client.request(
            "DELETE", "/api/deadletters", json=match, headers=AS_OPERATOR
        )
        assert deleted.status_code == 200, deleted.text
        assert deleted.json() == {"stream": S, "deleted": 3}
        assert (await client.get("/api/deadletters", headers=AS_VIEWER)).json() == []

        one = await client.delete(
            f"/api/deadletters?stream={S}&dlqId={ids[0]}", headers=AS_OPERATOR
        )
        assert one.status_code == 404
