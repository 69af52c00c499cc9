"""What the console's integration tests share: the app under test, signing in, the CSRF token
of a page, and a down consumer holding entries beside a live one."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import FastAPI
from redis.asyncio import Redis

from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from .helpers import fill, read, register

S, G = "rig:dispatch", "workers"
OPERATOR, VIEWER, AGENT = "op-secret-0123456789", "view-secret-012345678", "agent-secret-01234567"


def builder(make_settings: Callable[..., Settings]) -> Callable[..., FastAPI]:
    """An app with the three roles' tokens and no schedule; any setting overridden."""

    def make(**overrides: Any) -> FastAPI:
        values: dict[str, Any] = {
            "agent_ids": ("dev-e", "qa-e"),
            "streams": (S,),
            "dispatch_stream": S,
            "operator_tokens": OPERATOR,
            "viewer_tokens": VIEWER,
            "api_tokens": AGENT,
            "entry_stale_ms": 0,
        }
        values.update(overrides)
        return create_app(make_settings(**values), schedule_reaper=False)

    return make


async def client_of(app: FastAPI, base: str = "http://c") -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            yield client


async def sign_in(client: httpx.AsyncClient, token: str, *, prefix: str = "") -> str:
    """Sign in through the form; returns the CSRF token of the overview page."""
    answer = await post_sign_in(client, {"token": token}, prefix=prefix)
    assert answer.status_code == 303, answer.text
    page = await client.get(f"{prefix}/ui")
    assert page.status_code == 200
    return csrf_of(page.text)


async def post_sign_in(
    client: httpx.AsyncClient, data: dict[str, str], *, prefix: str = "", **options: Any
) -> httpx.Response:
    """POST the sign-in form as a browser does: first GET it, for its CSRF token and cookie."""
    form = await client.get(f"{prefix}/ui/login")
    assert form.status_code == 200, form.text
    return await client.post(
        f"{prefix}/ui/login", data={"csrf": csrf_of(form.text), **data}, **options
    )


async def flash_of(client: httpx.AsyncClient, answer: httpx.Response) -> str:
    """The message the page an action redirected to shows ("" for none)."""
    assert answer.status_code == 303, answer.text
    page = await client.get(answer.headers["location"])
    found = re.search(r'<p class="flash" role="status">Done: ([^<]*)</p>', page.text)
    return html.unescape(found.group(1)) if found else ""


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


async def heartbeat(client: httpx.AsyncClient, agent: str, consumer: str) -> None:
    answer = await client.post(
        "/api/events",
        json={"type": "HEARTBEAT", "agentId": agent, "consumer": consumer},
        headers={"Authorization": f"Bearer {AGENT}"},
    )
    assert answer.status_code == 202


async def stuck(redis: Redis, client: httpx.AsyncClient, n: int = 5) -> list[str]:
    """dev-e-0 (no heartbeat: down) holds `n` entries; qa-e-0 heartbeats and holds none."""
    await fill(redis, S, G, n)
    held = await read(redis, S, G, "dev-e-0", n)
    await register(redis, S, G, "qa-e-0")
    await heartbeat(client, "qa-e", "qa-e-0")
    return held
