"""The operator console at `/ui`: server-rendered pages (Jinja2) with htmx for live parts and
uPlot for the time series, all served from the package (nothing from a CDN)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from rig_conductor import roles
from rig_conductor.console import actions, pages, signin, web, work
from rig_conductor.operations import sessions


def install(app: FastAPI, *, tokens: roles.Tokens) -> None:
    app.state.console_tokens = tokens
    app.state.error_pages = web.problem  # the API's error handlers answer /ui with these
    app.mount("/ui/static", StaticFiles(directory=web.STATIC), name="console-static")
    app.state.sign_in_throttle = sessions.SignInThrottle()
    app.include_router(signin.router, prefix="/ui")
    app.include_router(actions.router, prefix="/ui")
    app.include_router(pages.router, prefix="/ui")
    app.include_router(work.router, prefix="/ui")
    app.add_exception_handler(web.SignInRequired, _sign_in)
    app.add_exception_handler(web.Refused, _refused)


async def _sign_in(request: Request, exc: Exception) -> Response:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.headers.get("hx-request"):
        # A page's live part polling after the session ended: the whole page goes to sign-in
        # (a redirect would be followed by the XHR and the form swapped into the live part).
        to = web.url(request, "/login", next=here)
        return Response(status_code=401, headers={"HX-Redirect": to, **web.SECURITY_HEADERS})
    if request.method == "GET":
        return web.redirect(request, "/login", next=here)
    return web.problem(request, 401, "Your session has ended: sign in again.")


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, web.Refused)
    return web.problem(request, exc.status, exc.detail)
