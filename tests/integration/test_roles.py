"""The three token roles on the JSON API, dead-letter delete, and serving under a root path."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events, scan_reports
from rig_conductor.app import create_app
from rig_conductor.console import session
from rig_conductor.settings import Settings

from .console_kit import csrf_of
from .helpers import fill, owners, read, register

S = "rig:dispatch"
AGENT, OPERATOR, VIEWER = "agent-tok-0123456789", "operator-tok-01234567", "viewer-tok-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _client(app: FastAPI, base: str = "http://c") -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            yield client


@pytest.fixture
def build(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> Callable[..., FastAPI]:
    def make(**overrides: Any) -> FastAPI:
        values: dict[str, Any] = {"agent_ids": ("dev-e",), "streams": (S,), "dispatch_stream": S}
        values.update(overrides)
        return create_app(make_settings(**values), schedule_reaper=False)

    return make


async def plant_dead_letter(redis: Redis, issue: str) -> str:
    """A dead letter as the reaper writes it: diagnostics, then the original fields."""
    fields = {
        "originalId": "1-1",
        "stream": S,
        "group": "workers",
        "consumer": "dev-e-0",
        "deliveries": "5",
        "reason": "max-deliveries",
        "type": "ISSUE_ASSIGNED",
        "issueId": issue,
    }
    return str(await redis.xadd(f"{S}:dlq", fields))


async def test_each_role_may_do_what_the_contract_says(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    app = build(api_tokens=AGENT, operator_tokens=OPERATOR, viewer_tokens=VIEWER)
    heartbeat = {"type": "HEARTBEAT", "agentId": "dev-e"}
    async for api in _client(app):
        # Reads: every role.
        for token in (AGENT, OPERATOR, VIEWER):
            assert (await api.get("/api/agents", headers=bearer(token))).status_code == 200
        assert (await api.get("/api/agents")).status_code == 401
        assert (await api.get("/api/agents", headers=bearer("nope"))).status_code == 401
        # Events: agents and operators, not viewers.
        assert (
            await api.post("/api/events", json=heartbeat, headers=bearer(AGENT))
        ).status_code == 202
        viewer_post = await api.post("/api/events", json=heartbeat, headers=bearer(VIEWER))
        assert viewer_post.status_code == 403 and "viewer" in viewer_post.json()["detail"]
        # Dry-run scans change nothing: every role. Real scans: operators only.
        for token in (AGENT, VIEWER, OPERATOR):
            dry = await api.post("/api/reaper/scan?dryRun=true", headers=bearer(token))
            assert dry.status_code == 200 and dry.json()["dryRun"] is True
        for token in (AGENT, VIEWER):
            assert (await api.post("/api/reaper/scan", headers=bearer(token))).status_code == 403
            assert (
                await api.post("/api/reaper/scan?dryRun=false", headers=bearer(token))
            ).status_code == 403
        assert (await api.post("/api/reaper/scan", headers=bearer(OPERATOR))).status_code == 200
        # Dead letters: requeue and delete are operator actions.
        dlq_id = await plant_dead_letter(redis, "rc-1")
        body = {"stream": S, "dlqId": dlq_id}
        for token in (AGENT, VIEWER):
            assert (
                await api.post("/api/deadletters/requeue", json=body, headers=bearer(token))
            ).status_code == 403
            assert (
                await api.delete(
                    "/api/deadletters", params={"stream": S, "dlqId": dlq_id}, headers=bearer(token)
                )
            ).status_code == 403
        assert await redis.xlen(f"{S}:dlq") == 1  # nothing refused changed anything
        done = await api.post("/api/deadletters/requeue", json=body, headers=bearer(OPERATOR))
        assert done.status_code == 201


@pytest.mark.parametrize(
    "query",
    [
        "dryRun=true&dryRun=false",  # the guard once read the first, FastAPI binds the last
        "dryRun=false&dryRun=true&dryRun=0",
        "dryRun=TRUE&dryRun=no",
        "dryRun=%74rue&dryRun=off",
    ],
)
async def test_a_repeated_dry_run_cannot_slip_a_real_scan_past_the_role_check(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine, query: str
) -> None:
    await fill(redis, S, "workers", 3)
    await read(redis, S, "workers", "dev-e-0", 3)  # dev-e never heartbeats: down
    await register(redis, S, "workers", "dev-e-1")
    app = build(api_tokens=AGENT, operator_tokens=OPERATOR, viewer_tokens=VIEWER, entry_stale_ms=0)
    async for api in _client(app):
        for token in (VIEWER, AGENT):
            answer = await api.post(f"/api/reaper/scan?{query}", headers=bearer(token))
            assert answer.status_code == 403, answer.text
        assert set((await owners(redis, S, "workers")).values()) == {"dev-e-0"}
        async with engine.connect() as conn:
            scans = (await conn.execute(select(scan_reports))).all()
        assert scans == []  # refused before any scan ran
        # The value the route parsed decides for everyone: the last one.
        last_true = await api.post(
            "/api/reaper/scan?dryRun=false&dryRun=true", headers=bearer(VIEWER)
        )
        assert last_true.status_code == 200 and last_true.json()["dryRun"] is True


async def test_without_operator_tokens_agent_tokens_may_change_things(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    async for api in _client(build(api_tokens=AGENT, viewer_tokens=VIEWER)):
        assert (await api.post("/api/reaper/scan", headers=bearer(AGENT))).status_code == 200
        assert (await api.post("/api/reaper/scan", headers=bearer(VIEWER))).status_code == 403
        dlq_id = await plant_dead_letter(redis, "rc-2")
        answer = await api.delete(
            "/api/deadletters", params={"stream": S, "dlqId": dlq_id}, headers=bearer(AGENT)
        )
        assert answer.status_code == 204


async def test_delete_removes_one_dead_letter_and_records_who(
    build: Callable[..., FastAPI], redis: Redis, engine: AsyncEngine
) -> None:
    async for api in _client(build(operator_tokens=OPERATOR)):
        keep = await plant_dead_letter(redis, "rc-keep")
        drop = await plant_dead_letter(redis, "rc-drop")
        gone = await api.delete(
            "/api/deadletters", params={"stream": S, "dlqId": drop}, headers=bearer(OPERATOR)
        )
        assert gone.status_code == 204
        assert [i for i, _ in await redis.xrange(f"{S}:dlq")] == [keep]
        again = await api.delete(
            "/api/deadletters", params={"stream": S, "dlqId": drop}, headers=bearer(OPERATOR)
        )
        assert again.status_code == 404 and drop in again.json()["detail"]
        bad = await api.delete(
            "/api/deadletters", params={"stream": S, "dlqId": "nope"}, headers=bearer(OPERATOR)
        )
        assert bad.status_code == 422
    async with engine.connect() as conn:
        row = (
            await conn.execute(select(events).where(events.c.kind == "DEAD_LETTER_DELETED"))
        ).one()
    assert (row.stream, row.issue_id, row.entry_id) == (S, "rc-drop", "1-1")
    assert row.detail["dlqId"] == drop and row.detail["by"].startswith("operator:")
    assert OPERATOR not in str(row.detail)


@pytest.mark.parametrize("stripped", [False, True], ids=["prefix-kept", "prefix-stripped"])
async def test_served_under_a_root_path_whether_the_ingress_strips_it_or_not(
    build: Callable[..., FastAPI], stripped: bool
) -> None:
    app = build(http_root_path="/rig")
    prefix = "" if stripped else "/rig"
    async for api in _client(app):
        assert (await api.get(f"{prefix}/healthz")).status_code == 200
        assert (await api.get(f"{prefix}/api/agents")).status_code == 200
        console = await api.get(f"{prefix}/ui")
        assert console.status_code == 200
        assert 'href="/rig/ui/agents"' in console.text
        assert 'src="/rig/ui/static/vendor/htmx-2.0.11.min.js"' in console.text
        asset = await api.get(f"{prefix}/ui/static/console.js")
        assert asset.status_code == 200 and "uPlot" in asset.text
        openapi = (await api.get(f"{prefix}/openapi.json")).json()
        assert "/api/deadletters" in openapi["paths"]


@pytest.mark.parametrize("stripped", [False, True], ids=["prefix-kept", "prefix-stripped"])
async def test_signing_in_under_a_root_path_whether_the_ingress_strips_it_or_not(
    build: Callable[..., FastAPI], stripped: bool
) -> None:
    """What the browser sees always carries the prefix: redirects, the form's action, and the
    cookies' Path (a cookie for /ui would never be sent back to /rig/ui)."""
    app = build(http_root_path="/rig", operator_tokens=OPERATOR)
    prefix = "" if stripped else "/rig"
    async for api in _client(app):
        api.cookies.clear()
        first = await api.get(f"{prefix}/ui/agents")
        assert first.status_code == 303
        assert first.headers["location"] == "/rig/ui/login?next=%2Frig%2Fui%2Fagents"
        form = await api.get(f"{prefix}/ui/login", params={"next": "/rig/ui/agents"})
        assert 'action="/rig/ui/login"' in form.text
        assert 'href="/rig/ui/static/console.css"' in form.text
        pre = form.cookies[session.PRE_COOKIE]
        assert "Path=/rig/ui;" in form.headers["set-cookie"]
        csrf = csrf_of(form.text)
        signed = await api.post(
            f"{prefix}/ui/login",
            data={"token": OPERATOR, "next": "/rig/ui/agents", "csrf": csrf},
            headers={"Cookie": f"{session.PRE_COOKIE}={pre}"},
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/rig/ui/agents"
        cookie = next(
            c for c in signed.headers.get_list("set-cookie") if c.startswith(session.COOKIE)
        )
        assert "Path=/rig/ui;" in cookie and "HttpOnly" in cookie
        own = {"Cookie": f"{session.COOKIE}={signed.cookies[session.COOKIE]}"}
        page = await api.get(f"{prefix}/ui/agents", headers=own)
        assert page.status_code == 200 and 'action="/rig/ui/logout"' in page.text
        out = await api.post(f"{prefix}/ui/logout", data={"csrf": csrf_of(page.text)}, headers=own)
        assert out.status_code == 303 and out.headers["location"] == "/rig/ui/login"
        assert "Path=/rig/ui" in out.headers["set-cookie"]


def test_a_root_path_must_be_a_path(make_settings: Callable[..., Settings]) -> None:
    from rig_conductor.settings import SettingsError, load_settings

    assert load_settings(http_root_path="/rig/").http_root_path == "/rig"
    with pytest.raises(SettingsError, match="RIG_HTTP_ROOT_PATH"):
        load_settings(http_root_path="rig")
