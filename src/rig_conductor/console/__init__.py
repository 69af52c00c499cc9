"""The operator console at `/ui`: server-rendered pages (Jinja2) with htmx for live parts and
uPlot for the time series, all served from the package (nothing from a CDN)."""

from __future__ import annotations

import html

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from rig_conductor import roles
from rig_conductor.console import actions, pages, web


def install(app: FastAPI, *, tokens: roles.Tokens) -> None:
    app.state.console_tokens = tokens
    app.mount("/ui/static", StaticFiles(directory=web.STATIC), name="console-static")
    app.include_router(actions.router, prefix="/ui")
    app.include_router(pages.router, prefix="/ui")
    app.add_exception_handler(web.SignInRequired, _sign_in)
    app.add_exception_handler(web.Refused, _refused)


async def _sign_in(request: Request, exc: Exception) -> Response:
    if request.method == "GET":
        here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return web.redirect(request, "/login", next=here)
    return HTMLResponse("sign in first", status_code=401)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, web.Refused)
    return HTMLResponse(
        f"<p>{html.escape(exc.detail)}</p>", status_code=exc.status, headers=web.SECURITY_HEADERS
    )
