"""Signing in and out of the console.

The sign-in form carries a CSRF token bound to a cookie of its own (there is no session yet),
so another site cannot sign a browser in with its own token. A token that is not valid is
logged and recorded (`operations.sessions.sign_in_failed`), and an address that keeps failing
is made to wait (`SignInThrottle`): its wrong tokens get 429, a valid token still signs in.
Signing out ends the session on the server too. Where a sign-in leads (`next`) is always a
path of this console (`web.safe_next`): no open redirect.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, Response

from rig_conductor.console import session, web
from rig_conductor.console.session import Session
from rig_conductor.operations import sessions

router = APIRouter(include_in_schema=False)

SessionDep = Annotated[Session, Depends(web.current)]


def throttle(request: Request) -> sessions.SignInThrottle:
    found: sessions.SignInThrottle = request.app.state.sign_in_throttle
    return found


@router.get("/login")
async def login_form(request: Request, next: str = "") -> Response:
    if web.tokens(request).open:
        return web.redirect(request, "")
    return _login_page(request, next=web.safe_next(request, next))


@router.post("/login")
async def login(
    request: Request,
    token: Annotated[str, Form(max_length=4096)],
    next: Annotated[str, Form(max_length=2048)] = "",
    csrf: Annotated[str | None, Form(max_length=128)] = None,
) -> Response:
    tokens = web.tokens(request)
    next = web.safe_next(request, next)
    if not session.sign_in_csrf_ok(tokens, web.read_cookie(request, session.PRE_COOKIE), csrf):
        error = "The sign-in form had expired: sign in again."
        return _login_page(request, next=next, error=error, status=403)
    # The token first: a valid one always signs in, even from an address that is made to wait
    # (behind an ingress, every browser shares the proxy's address, a guesser's too).
    signed = session.sign_in(tokens, token)
    if signed is None:
        client = request.client.host if request.client else "unknown"
        wait = throttle(request).wait_s(client)
        if wait > 0:
            seconds = math.ceil(wait)
            error = f"Too many failed sign-ins from your address: try again in {seconds} s."
            page = _login_page(request, next=next, error=error, status=429)
            page.headers["Retry-After"] = str(seconds)
            return page
        failures = throttle(request).failed(client)
        await sessions.sign_in_failed(web.runtime(request), client=client, failures=failures)
        return _login_page(request, next=next, error="That token is not valid.", status=401)
    _, cookie = signed
    response = web.redirect(request, "")
    response.headers["location"] = next
    web.set_cookie(request, response, cookie)
    web.delete_cookie(request, response, session.PRE_COOKIE)
    return response


@router.post("/logout")
async def logout(
    request: Request, you: SessionDep, csrf: Annotated[str | None, Form()] = None
) -> Response:
    if not you.csrf_ok(csrf or request.headers.get("x-csrf-token")):
        raise web.Refused(403, "missing or invalid CSRF token; reload the page")
    await sessions.sign_out(web.runtime(request), you.caller, nonce=you.nonce, expires=you.expires)
    response = web.redirect(request, "/login")
    web.delete_cookie(request, response)
    return response


def _login_page(request: Request, *, next: str, error: str = "", status: int = 200) -> Response:
    """The sign-in form, with the CSRF token of this browser's pre-session cookie."""
    nonce = session.pre_session(web.read_cookie(request, session.PRE_COOKIE))
    body = web.templates.get_template("login.html").render(
        url=lambda path, **q: web.url(request, path, **q),
        static=lambda name: web.url(request, f"/static/{name}"),
        next=next,
        error=error,
        csrf=session.sign_in_csrf(web.tokens(request), nonce),
    )
    response = HTMLResponse(body, status_code=status, headers=web.SECURITY_HEADERS)
    web.set_cookie(request, response, nonce, name=session.PRE_COOKIE, max_age=session.PRE_TTL_S)
    return response
