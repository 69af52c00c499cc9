"""What protects the console's users: the CSRF token on every change, escaping of everything
Redis holds, and the Content Security Policy (no inline script) on every page."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import scan_reports
from rig_conductor.console import session

from .console_kit import OPERATOR, G, S, client_of, csrf_of, sign_in, stuck
from .helpers import owners

EVIL = "<script>alert('x')</script>"


# Every POST route of the console with a session (sign-in has its own form token: see
# test_console_sessions), with what it needs besides the CSRF token.
CHANGES: dict[str, tuple[str, Callable[[list[str], str], dict[str, Any]]]] = {
    "sign-out": ("/ui/logout", lambda held, dlq: {}),
    "requeue": ("/ui/deadletters/requeue", lambda held, dlq: {"stream": S, "one": dlq}),
    "requeue-all": ("/ui/deadletters/requeue", lambda h, d: {"stream": S, "all_matching": "1"}),
    "delete": ("/ui/deadletters/delete", lambda held, dlq: {"stream": S, "ids": [dlq]}),
    "move": (
        "/ui/move",
        lambda held, dlq: {
            "stream": S,
            "group": G,
            "consumer": "dev-e-0",
            "target": "qa-e-0",
            "entries": held,
        },
    ),
    "scan-preview": ("/ui/scan", lambda held, dlq: {}),
    "scan-apply": ("/ui/scan", lambda held, dlq: {"apply": "true"}),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("token", ["missing", "wrong", "another session's"])
async def test_every_change_needs_the_csrf_token_of_its_own_session(
    build: Callable[..., FastAPI],
    console: httpx.AsyncClient,
    redis: Redis,
    engine: AsyncEngine,
    change: str,
    token: str,
) -> None:
    held = await stuck(redis, console, 3)
    dlq_id = await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
    presented = {"missing": None, "wrong": "0" * 64}.get(token)
    if token == "another session's":
        async for other in client_of(build()):
            presented = await sign_in(other, OPERATOR)
    csrf = await sign_in(console, OPERATOR)  # an operator: only the CSRF check stands in the way
    path, data = CHANGES[change]
    form = data(held, dlq_id) | ({"csrf": presented} if presented else {})
    answer = await console.post(path, data=form)
    assert answer.status_code == 403, answer.text
    assert "missing or invalid CSRF token" in answer.text
    # Nothing changed, and the session still holds.
    assert await redis.xlen(f"{S}:dlq") == 1 and await redis.xlen(S) == 3
    assert set((await owners(redis, S, G)).values()) == {"dev-e-0"}
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(scan_reports))).scalar() == 0
    assert (await console.get("/ui")).status_code == 200
    # The same request with the page's token goes through.
    ok = await console.post(path, data=data(held, dlq_id) | {"csrf": csrf})
    assert ok.status_code in (200, 303), ok.text


async def test_requeue_and_delete_write_who_did_it(
    console: httpx.AsyncClient, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "issueId": "rc-1"})
    second = await redis.xadd(f"{S}:dlq", {"originalId": "1-2", "issueId": "rc-2"})
    csrf = await sign_in(console, OPERATOR)
    caplog.set_level(logging.INFO)
    await console.post("/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "one": first})
    await console.post("/ui/deadletters/delete", data={"csrf": csrf, "stream": S, "one": second})
    [(new_id, _)] = await redis.xrange(S)
    who = r"operator:[0-9a-f]{8}"
    assert re.search(
        rf"\[Console\] {who} requeued dead letter {first} of {S} as {new_id}", caplog.text
    )
    assert re.search(rf"\[Console\] {who} deleted dead letter {second} of {S}", caplog.text)
    assert OPERATOR not in caplog.text


async def test_what_redis_holds_is_escaped_on_every_page(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await redis.xgroup_create(S, G, id="0", mkstream=True)
    await redis.xadd(S, {"type": "ISSUE_ASSIGNED", "issueId": EVIL, EVIL: "payload " + EVIL})
    await redis.xreadgroup(G, "dev-e-0", {S: ">"}, count=10)
    await redis.xadd(
        f"{S}:dlq",
        {
            "originalId": "1-1",
            "group": G,
            "consumer": EVIL,
            "deliveries": "5",
            "reason": EVIL,
            "issueId": EVIL,
            EVIL: EVIL,
        },
    )
    await sign_in(console, OPERATOR)
    pages = [
        await console.get("/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0"}),
        await console.get("/ui/deadletters"),
        await console.get("/ui/deadletters", params={"q": EVIL}),
    ]
    for page in pages:
        assert page.status_code == 200
        assert "<script>alert" not in page.text, page.request.url
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text, page.request.url


def assert_safe(answer: httpx.Response) -> None:
    """The console's own scripts only: the policy, and nothing inline for it to block."""
    where = f"{answer.request.method} {answer.request.url} ({answer.status_code})"
    policy = answer.headers.get("content-security-policy", "")
    for rule in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
        assert rule in policy, where
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, where
    assert answer.headers.get("x-content-type-options") == "nosniff", where
    text = answer.text
    assert not re.search(r"<script(?![^>]*\b(src=\"/|type=\"application/json\"))", text), where
    assert not re.search(r"\son[a-z]+\s*=", text, re.I), where  # no inline event handlers
    assert "javascript:" not in text.lower(), where
    assert not re.search(r"\sstyle\s*=", text, re.I), where  # style-src 'self' would drop it
    assert not re.search(r'(src|href|action)="(https?:)?//', text), where


async def test_every_console_page_has_the_policy_and_no_inline_script(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    held = await stuck(redis, console, 2)
    await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
    signed_out = [await console.get("/ui/login"), await console.get("/ui")]
    assert signed_out[1].status_code == 303
    assert_safe(signed_out[0])
    csrf = await sign_in(console, OPERATOR)
    pending = {"stream": S, "group": G, "consumer": "dev-e-0"}
    answers = [
        await console.get("/ui"),
        await console.get("/ui", headers={"HX-Request": "true"}),
        await console.get("/ui/group", params={"stream": S, "name": G}),
        await console.get("/ui/group", params={"stream": S, "name": "missing"}),  # 404 page
        await console.get("/ui/pending", params=pending),
        await console.get("/ui/pending", params={**pending, "after": held[0]}),
        await console.get("/ui/pending", params={**pending, "after": "bad"}),  # 400 page
        await console.get("/ui/agents"),
        await console.get("/ui/deadletters"),
        await console.get("/ui/deadletters", params={"stream": "*"}),  # 400 page
        await console.get("/ui/reclaims"),
        await console.get("/ui/scan"),
        await console.post("/ui/scan", data={"csrf": csrf}),
        await console.post("/ui/scan", data={}),  # 403 page
        await console.post("/ui/move", data={"csrf": csrf, **pending, "target": "nobody"}),
    ]
    assert {a.status_code for a in answers} == {200, 400, 403, 404, 409}
    for answer in answers:
        assert_safe(answer)
    assert csrf_of(answers[0].text) == csrf
    console.cookies.delete(session.COOKIE)
    expired = await console.post("/ui/scan", data={"csrf": csrf})
    assert expired.status_code == 401
    assert_safe(expired)


@pytest.mark.parametrize(
    ("query", "shown"),
    [
        ({"done": "deleted", "n": "5"}, "deleted 5"),
        ({"done": "requeued", "n": "12"}, "requeued 12"),
        ({"done": "Your session expired: sign in at evil.example"}, None),
        ({"done": EVIL}, None),
        ({"done": "deleted", "n": "5 at evil.example"}, None),
        ({"done": "deleted", "n": "\u00b2"}, None),  # a digit to str.isdigit, not to int()
        ({"done": "deleted", "n": "9" * 30}, None),
    ],
)
async def test_the_done_message_is_one_of_a_fixed_set(
    console: httpx.AsyncClient, query: dict[str, str], shown: str | None
) -> None:
    await sign_in(console, OPERATOR)
    page = await console.get("/ui/deadletters", params=query)
    assert page.status_code == 200
    found = re.findall(r'<p class="flash" role="status">Done: ([^<]*)</p>', page.text)
    assert found == ([shown] if shown else [])


async def test_a_move_message_names_only_a_consumer_of_the_group(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await stuck(redis, console, 1)
    await sign_in(console, OPERATOR)
    pending = {"stream": S, "group": G, "consumer": "dev-e-0", "done": "moved", "n": "1"}
    for to, shown in (("qa-e-0", "moved 1 of 3 to qa-e-0"), ("evil.example", "moved 1 of 3")):
        page = await console.get("/ui/pending", params={**pending, "of": "3", "to": to})
        assert f"Done: {shown}</p>" in page.text
    assert "evil.example</p>" not in page.text


async def test_an_ended_session_sends_a_polling_page_to_sign_in_whole(
    console: httpx.AsyncClient,
) -> None:
    """The live part of a page polls with htmx: when the session has ended, the answer is an
    HX-Redirect for the whole page, not the sign-in form swapped into the live part."""
    await sign_in(console, OPERATOR)
    console.cookies.delete(session.COOKIE)
    polled = await console.get(
        "/ui/deadletters", params={"stream": S}, headers={"HX-Request": "true"}
    )
    assert polled.status_code == 401
    assert (
        polled.headers["hx-redirect"]
        == "/ui/login?next=%2Fui%2Fdeadletters%3Fstream%3Drig%253Adispatch"
    )
    assert "<form" not in polled.text and "token" not in polled.text
    plain = await console.get("/ui/deadletters")
    assert plain.status_code == 303 and plain.headers["location"].startswith("/ui/login?next=")
