"""The console's sessions over HTTP (real app, Redis and PostgreSQL): signing in and out, the
cookie, CSRF on every change, and the open console."""

from __future__ import annotations

import html
import logging
from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres.tables import events
from rig_conductor.console import session
from rig_conductor.operations import sessions

from .console_kit import OPERATOR, VIEWER, S, client_of, csrf_of, post_sign_in, sign_in

SECRET = "a-secret-shared-by-replicas-0123456789"


async def test_pages_need_a_session_and_sign_in_sets_a_strict_cookie(
    console: httpx.AsyncClient,
) -> None:
    first = await console.get("/ui/agents?x=1")
    assert first.status_code == 303
    assert first.headers["location"] == "/ui/login?next=%2Fui%2Fagents%3Fx%3D1"
    wrong = await post_sign_in(console, {"token": "guess"})
    assert wrong.status_code == 401 and "not valid" in wrong.text
    assert session.COOKIE not in wrong.cookies
    ok = await post_sign_in(console, {"token": VIEWER, "next": "/ui/agents?x=1"})
    assert ok.status_code == 303 and ok.headers["location"] == "/ui/agents?x=1"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert "Secure" not in cookie  # plain http here
    assert VIEWER not in cookie
    assert (await console.get("/ui/agents")).status_code == 200
    # An open redirect is refused: `next` must stay inside the console.
    elsewhere = await post_sign_in(console, {"token": VIEWER, "next": "//evil.example/"})
    assert elsewhere.headers["location"] == "/ui"


async def test_behind_an_https_ingress_the_cookies_are_host_cookies(
    build: Callable[..., FastAPI],
) -> None:
    """Only behind a proxy of RIG_FORWARDED_ALLOW_IPS (the test client's peer is 127.0.0.1):
    from anyone else, `X-Forwarded-Proto: https` over plain http is ignored."""
    https = {"X-Forwarded-Proto": "https"}
    async for console in client_of(build(forwarded_allow_ips="127.0.0.1")):
        form = await console.get("/ui/login", headers=https)
        assert _attributes(form, f"__Host-{session.PRE_COOKIE}") >= {"secure", "path=/"}
    async for console in client_of(build(forwarded_allow_ips="10.0.0.0/8")):
        form = await console.get("/ui/login", headers=https)
        assert "secure" not in _attributes(form, session.PRE_COOKIE)


@pytest.mark.parametrize("root", ["", "/rig"])
async def test_over_https_the_cookies_are_host_cookies(
    build: Callable[..., FastAPI], root: str
) -> None:
    """`__Host-` cookies, Secure, Path=/ and no Domain (RIG_HTTP_ROOT_PATH too: the name then
    carries the root path); sign-in, pages, actions and sign-out work with them."""
    suffix = "_rig" if root else ""
    name, pre = f"__Host-{session.COOKIE}{suffix}", f"__Host-{session.PRE_COOKIE}{suffix}"
    async for console in client_of(build(http_root_path=root), "https://c"):
        form = await console.get(f"{root}/ui/login")
        assert _attributes(form, pre) >= {"secure", "httponly", "path=/", "samesite=strict"}
        ok = await post_sign_in(console, {"token": OPERATOR}, prefix=root)
        assert ok.status_code == 303, ok.text
        cookie = _attributes(ok, name)
        assert cookie >= {"secure", "httponly", "path=/", "samesite=strict"}
        assert not any(a.startswith("domain") for a in cookie)
        assert _attributes(ok, pre) >= {"max-age=0", "secure", "path=/"}  # the nonce's, spent
        assert set(console.cookies) == {name}
        page = await console.get(f"{root}/ui")
        assert page.status_code == 200
        out = await console.post(f"{root}/ui/logout", data={"csrf": csrf_of(page.text)})
        assert _attributes(out, name) >= {"max-age=0", "secure", "path=/"}
        assert (await console.get(f"{root}/ui")).status_code == 303


async def test_over_plain_http_the_cookies_keep_their_names_under_the_root_path(
    build: Callable[..., FastAPI],
) -> None:
    async for console in client_of(build(http_root_path="/rig")):
        ok = await post_sign_in(console, {"token": VIEWER}, prefix="/rig")
        cookie = _attributes(ok, session.COOKIE)
        assert "path=/rig/ui" in cookie and "secure" not in cookie
        assert (await console.get("/rig/ui")).status_code == 200


def _attributes(answer: httpx.Response, name: str) -> set[str]:
    """The attributes (lower case) of the Set-Cookie header for cookie `name`."""
    [found] = [c for c in answer.headers.get_list("set-cookie") if c.startswith(name + "=")]
    return {part.strip().lower() for part in found.split(";")[1:]}


async def test_sign_out_forged_and_expired_sessions(
    console: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sign_in(console, OPERATOR)
    cookie = console.cookies[session.COOKIE]
    console.cookies.clear()
    # A cookie whose signature does not hold, or made up, is no session.
    payload, _, signature = cookie.partition(".")
    for forged in (f"{payload}.{signature[::-1]}", "e30.e30", "garbage", cookie + "x"):
        console.cookies.set(session.COOKIE, forged)
        assert (await console.get("/ui")).status_code == 303
        console.cookies.clear()
    csrf = await sign_in(console, OPERATOR)
    out = await console.post("/ui/logout", data={"csrf": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/ui/login"
    assert (
        'rig_session=""' in out.headers["set-cookie"] and "Max-Age=0" in out.headers["set-cookie"]
    )
    assert (await console.get("/ui")).status_code == 303
    monkeypatch.setattr(session, "TTL_S", -1)
    await post_sign_in(console, {"token": OPERATOR})
    assert (await console.get("/ui")).status_code == 303  # expired at once


async def test_actions_need_the_csrf_token(console: httpx.AsyncClient, redis: Redis) -> None:
    csrf = await sign_in(console, OPERATOR)
    dlq_id = await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
    for data in ({"stream": S, "one": dlq_id}, {"stream": S, "one": dlq_id, "csrf": "x" * 64}):
        answer = await console.post("/ui/deadletters/delete", data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text
    assert await redis.xlen(f"{S}:dlq") == 1
    ok = await console.post(
        "/ui/deadletters/delete", data={"stream": S, "one": dlq_id, "csrf": csrf}
    )
    assert ok.status_code == 303 and "done=deleted&n=1" in ok.headers["location"]
    assert await redis.xlen(f"{S}:dlq") == 0


async def test_an_open_console_needs_no_sign_in_but_still_a_csrf_token(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    app = build(operator_tokens="", viewer_tokens="", api_tokens="")
    async for console in client_of(app):
        assert (await console.get("/ui/login")).status_code == 303
        page = await console.get("/ui/scan")
        assert page.status_code == 200 and "anonymous" in page.text
        assert (await console.post("/ui/scan", data={"apply": "true"})).status_code == 403
        ok = await console.post("/ui/scan", data={"csrf": csrf_of(page.text), "apply": "true"})
        assert ok.status_code == 200


async def test_signing_out_ends_the_session_on_the_server(
    build: Callable[..., FastAPI], redis: Redis
) -> None:
    """The cookie of a signed-out session, replayed (copied before the sign-out, or on another
    replica), is sent to sign-in, and its CSRF token changes nothing."""
    app, other_replica = build(session_secret=SECRET), build(session_secret=SECRET)
    async for console in client_of(app):
        csrf = await sign_in(console, OPERATOR)
        old = console.cookies[session.COOKIE]
        dlq_id = await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
        out = await console.post("/ui/logout", data={"csrf": csrf})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        console.cookies.clear()
        console.cookies.set(session.COOKIE, old)
        replayed = await console.get("/ui/deadletters")
        assert replayed.status_code == 303
        assert replayed.headers["location"].startswith("/ui/login?next=")
        forged = await console.post(
            "/ui/deadletters/delete", data={"csrf": csrf, "stream": S, "one": dlq_id}
        )
        assert forged.status_code == 401 and await redis.xlen(f"{S}:dlq") == 1
        # The mark lasts as long as the session would have, not longer.
        [key] = [k async for k in redis.scan_iter(match="*console-revoked*")]
        assert 0 < await redis.pttl(key) <= session.TTL_S * 1000
    async for console in client_of(other_replica):
        console.cookies.set(session.COOKIE, old)
        assert (await console.get("/ui")).status_code == 303


async def test_replicas_with_the_same_secret_share_sessions_and_others_do_not(
    build: Callable[..., FastAPI],
) -> None:
    cookie = ""
    async for first in client_of(build(session_secret=SECRET)):
        await sign_in(first, OPERATOR)
        cookie = first.cookies[session.COOKIE]
    for secret, status in (
        (SECRET, 200),
        ("another-secret-of-another-deployment", 303),
        (None, 303),
    ):
        async for replica in client_of(build(session_secret=secret)):
            replica.cookies.set(session.COOKIE, cookie)
            assert (await replica.get("/ui")).status_code == status, secret


async def test_the_sign_in_form_needs_its_own_csrf_token(
    console: httpx.AsyncClient, build: Callable[..., FastAPI]
) -> None:
    """Another site cannot sign a browser in (with the other site's token): the form's token
    is bound to a cookie only this console sets."""
    bare = await console.post("/ui/login", data={"token": OPERATOR})
    assert bare.status_code == 403 and "expired" in bare.text
    assert session.COOKIE not in bare.cookies
    form = await console.get("/ui/login")
    csrf = csrf_of(form.text)
    assert session.PRE_COOKIE in form.cookies
    # The token of this form, without its cookie (another browser), is refused.
    async for other in client_of(build()):
        stolen = await other.post("/ui/login", data={"token": OPERATOR, "csrf": csrf})
        assert stolen.status_code == 403 and session.COOKIE not in stolen.cookies
    wrong = await console.post("/ui/login", data={"token": OPERATOR, "csrf": "0" * 64})
    assert wrong.status_code == 403
    ok = await console.post("/ui/login", data={"token": OPERATOR, "csrf": csrf})
    assert ok.status_code == 303 and session.COOKIE in ok.cookies


async def test_failed_sign_ins_are_logged_recorded_and_slowed_down(
    build: Callable[..., FastAPI], engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    now = [1000.0]
    app = build()
    app.state.sign_in_throttle = sessions.SignInThrottle(clock=lambda: now[0])
    async for console in client_of(app):
        await _fail_three_times_then_wait(console, caplog, now)
    async with engine.connect() as conn:
        rows = (
            await conn.execute(select(events.c.detail).where(events.c.kind == "SIGN_IN_FAILED"))
        ).scalars()
        details = list(rows)
    assert [d["failures"] for d in details] == [1, 2, 3, 4]
    assert {d["client"] for d in details} == {"127.0.0.1"}


async def _fail_three_times_then_wait(
    console: httpx.AsyncClient, caplog: pytest.LogCaptureFixture, now: list[float]
) -> None:
    for n in (1, 2, 3):
        answer = await post_sign_in(console, {"token": f"guess-{n}"})
        assert answer.status_code == 401 and "not valid" in answer.text
    lines = [r for r in caplog.records if "Sign-in refused" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING] * 3
    assert lines[-1].getMessage().startswith("[Console] Sign-in refused from 127.0.0.1")
    assert "guess" not in caplog.text
    # The fourth try comes too soon: a wrong token is turned away without being counted...
    slowed = await post_sign_in(console, {"token": "guess-4"})
    assert slowed.status_code == 429 and slowed.headers["retry-after"] == "1"
    assert session.COOKIE not in slowed.cookies
    # ...but the valid token signs in all the same: behind an ingress every browser shares the
    # address the guesser made wait.
    valid = await post_sign_in(console, {"token": OPERATOR})
    assert valid.status_code == 303 and session.COOKIE in valid.cookies
    # Signing in cleared nothing: the next wrong token still waits.
    assert (await post_sign_in(console, {"token": "guess-5"})).status_code == 429
    now[0] += 1.5
    assert (await post_sign_in(console, {"token": "guess-6"})).status_code == 401


@pytest.mark.parametrize(
    ("asked", "lands"),
    [
        ("/ui/agents?x=1", "/ui/agents?x=1"),
        (
            "/ui/pending?stream=rig:dispatch&consumer=a b",
            "/ui/pending?stream=rig:dispatch&consumer=a%20b",
        ),
        ("/ui/deadletters?q=<script>", "/ui/deadletters?q=%3Cscript%3E"),
        ("/ui", "/ui"),
        ("", "/ui"),
        ("//evil.example/", "/ui"),
        ("https://evil.example/ui", "/ui"),
        ("javascript:alert(1)", "/ui"),
        ("/\\evil.example", "/ui"),
        ("/ui/\\evil.example", "/ui"),
        ("/uievil", "/ui"),
        ("/ui/../api/agents", "/ui"),
        ("/ui\r\nSet-Cookie: x=1", "/ui"),
        ("/ui/agents\nLocation: //evil.example", "/ui"),
        ("/api/agents", "/ui"),
        ("ui/agents", "/ui"),
    ],
)
async def test_sign_in_leads_only_to_a_path_of_the_console(
    console: httpx.AsyncClient, asked: str, lands: str
) -> None:
    form = await console.get("/ui/login", params={"next": asked})
    assert form.status_code == 200
    assert f'name="next" value="{html.escape(lands)}"' in form.text
    ok = await post_sign_in(console, {"token": VIEWER, "next": asked})
    assert ok.status_code == 303 and ok.headers["location"] == lands


async def test_sign_in_under_a_root_path_leads_only_under_it(
    build: Callable[..., FastAPI],
) -> None:
    async for console in client_of(build(http_root_path="/rig")):
        for asked, lands in (
            ("/rig/ui/agents", "/rig/ui/agents"),
            ("/ui/agents", "/rig/ui"),
            ("/rigx/ui", "/rig/ui"),
            ("//evil.example/rig/ui", "/rig/ui"),
        ):
            ok = await post_sign_in(console, {"token": VIEWER, "next": asked}, prefix="/rig")
            assert ok.status_code == 303 and ok.headers["location"] == lands, asked
