"""What the console's pages and actions share: the templates, the session guard, and
rendering (a whole page, or just the live part of it for htmx's polling)."""

from __future__ import annotations

import re
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import AfterValidator

from rig_conductor import __version__, domain, roles
from rig_conductor.console import session
from rig_conductor.domain import StreamKey
from rig_conductor.operations import sessions, views
from rig_conductor.runtime import Runtime

HERE = Path(__file__).parent
# What a cookie name may not hold (RFC 6265 token): a root path's `/` among it.
_NOT_TOKEN = re.compile(r"[^A-Za-z0-9_.-]")
STATIC = HERE / "static"
templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)
# Scripts and styles only from the console itself: nothing inline, nothing from a CDN.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


# A stream entry id in a form or a query (ids, cursors): a bad one is a 400 page, never sent on.
EntryIdText = Annotated[str, AfterValidator(domain.entry_id)]
PROBLEMS = {400: "Bad request", 401: "Sign in first", 403: "Not allowed", 404: "Not found"}
# What an action did, said on the page it leads to: a fixed message per `done` key filled with
# counts, never text from the query string (a link could otherwise make the console say
# anything). A move's target is named only when the page vouches for it.
FLASH = {"requeued": "requeued {n}", "deleted": "deleted {n}", "moved": "moved {n} of {of}"}
_COUNTS = ("n", "of", "dead", "gone", "left")
_MOVE_NOTES = (
    (
        "dead",
        "{} dead-lettered: they had reached RIG_MAX_DELIVERIES, as the reaper would have done",
    ),
    ("gone", "{} no longer pending for this consumer"),
    ("left", "{} left: touched since they were looked up"),
)


class SignInRequired(Exception):
    """No valid session: the page redirects to the sign-in form."""


class Refused(Exception):
    """A request refused: 400 (bad input), 403 (no CSRF token, or a role that may not change
    things). Answered with `problem`."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


def tokens(request: Request) -> roles.Tokens:
    value: roles.Tokens = request.app.state.console_tokens
    return value


def url(request: Request, path: str, **query: Any) -> str:
    """A console URL under the root path, with the non-empty query parameters."""
    root = request.scope.get("root_path", "")
    params = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{root}/ui{path}" + (f"?{urlencode(params)}" if params else "")


def stream_key(request: Request, name: str) -> StreamKey:
    """A stream named in a query or a form: one the settings cover (`views.known_stream`), else
    a 400 page. Never a pattern: reading one would SCAN the keyspace."""
    try:
        domain.name(name)
    except ValueError as exc:
        raise Refused(400, f"stream {name[:256]!r}: {exc}") from None
    if not views.known_stream(runtime(request).settings, name):
        raise Refused(400, f"{name[:256]!r} is not a stream of RIG_DISPATCH_STREAM or RIG_STREAMS")
    return StreamKey(name)


def safe_next(request: Request, value: str) -> str:
    """Where to go after signing in: `value` when it is a console path under the root path
    (URL-quoted), else the overview. Never another site: no scheme, no host, no `//` or `\\`,
    no control characters (a CR/LF would split the Location header), no dot segments."""
    home = url(request, "")
    if not value.startswith("/") or value.startswith("//") or "\\" in value:
        return home
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in value):
        return home
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return home
    path = parts.path
    if path != home and not path.startswith(home + "/"):
        return home
    if any(segment in (".", "..") for segment in path.split("/")):
        return home
    quoted = quote(path, safe="/%-._~!$&'()*+,;=:@")
    query = quote(parts.query, safe="/%-._~!$&'()*+,;=:@?")
    return quoted + (f"?{query}" if query else "")


async def current(request: Request) -> session.Session:
    """The request's session; SignInRequired without one, or for one signed out. An open
    console (no tokens at all) has no sign-in: the visitor gets an anonymous session, set on
    the response by `page`."""
    found = session.read(tokens(request), read_cookie(request))
    if found is not None and not await sessions.signed_out(runtime(request), nonce=found.nonce):
        return found
    if tokens(request).open:
        fresh, cookie = session.anonymous(tokens(request))
        request.state.new_cookie = cookie
        return fresh
    raise SignInRequired


def require_change(request: Request, current_session: session.Session, csrf: str | None) -> None:
    """An action: the CSRF token must match, and the role must be allowed to change things."""
    presented = csrf or request.headers.get("x-csrf-token")
    if not current_session.csrf_ok(presented):
        raise Refused(403, "missing or invalid CSRF token; reload the page")
    if not tokens(request).allows(current_session.caller, roles.Need.CHANGE):
        raise Refused(403, f"the {current_session.caller.role.name.lower()} role may not do this")


def flash(request: Request, *, targets: Collection[str] = ()) -> str | None:
    """The message of the action that led here (`done=<key>` and counts), if any."""
    query = request.query_params
    done = query.get("done", "")
    template = FLASH.get(done)
    if template is None:
        return None
    counts: dict[str, int] = {}
    for name in _COUNTS:
        raw = query.get(name, "0")
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
            return None
        counts[name] = int(raw)
    text = template.format(**counts)
    if done == "moved":
        target = query.get("to", "")
        if target and target in targets:
            text += f" to {target}"
        text += "".join(f"; {note.format(counts[key])}" for key, note in _MOVE_NOTES if counts[key])
    return text


def page(
    request: Request,
    template: str,
    current_session: session.Session,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    """Render a page; for an htmx request, only the part it asks for (the template's `live`
    block when polled)."""
    env = {
        "request": request,
        "url": lambda path, **q: url(request, path, **q),
        "static": lambda name: f"{request.scope.get('root_path', '')}/ui/static/{name}",
        "who": current_session.caller.who,
        "role": current_session.caller.role.name.lower(),
        "can_change": tokens(request).allows(current_session.caller, roles.Need.CHANGE),
        "open_console": tokens(request).open,
        "csrf": current_session.csrf,
        "version": __version__,
        "now": datetime.now(UTC),
        "ms": format_ms,
        "when": format_time,
        "flash": flash(request, targets=context.pop("flash_targets", ())),
        **context,
    }
    compiled = templates.get_template(template)
    if request.headers.get("hx-request") and "live" in compiled.blocks:
        body = "".join(compiled.blocks["live"](compiled.new_context(env)))
    else:
        body = compiled.render(env)
    response = HTMLResponse(body, status_code=status_code, headers=SECURITY_HEADERS)
    new_cookie = getattr(request.state, "new_cookie", None)
    if new_cookie:
        set_cookie(request, response, new_cookie)
    return response


def problem(request: Request, status: int, message: str) -> HTMLResponse:
    """An error as a page of its own (no session needed): the message is escaped."""
    body = templates.get_template("problem.html").render(
        heading=PROBLEMS.get(status, "Sorry"),
        message=message,
        home=url(request, ""),
        static=lambda name: url(request, f"/static/{name}"),
    )
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)


def https(request: Request) -> bool:
    """Whether the browser's request came over https: the connection's own scheme, which a
    proxy of RIG_FORWARDED_ALLOW_IPS may have set from `X-Forwarded-Proto` (`app.py`); the
    header itself is never read here, so nobody else can claim https with it."""
    return request.url.scheme == "https"


def cookie_name(request: Request, name: str = session.COOKIE) -> str:
    """The name cookie `name` goes by on this request. Over https, `__Host-<name>`: the browser
    takes it only Secure, for Path=/ and with no Domain, so neither a plain-http page nor a
    sibling subdomain can set or shadow it (a planted session or sign-in nonce). Path=/ is
    host-wide, so under RIG_HTTP_ROOT_PATH the name carries the root path, and two consoles on
    one host keep their sessions apart. Over plain http, `name` as it always was."""
    if not https(request):
        return name
    root = request.scope.get("root_path", "").strip("/")
    return "__Host-" + name + ("_" + _NOT_TOKEN.sub("_", root) if root else "")


def read_cookie(request: Request, name: str = session.COOKIE) -> str | None:
    return request.cookies.get(cookie_name(request, name))


def set_cookie(
    request: Request,
    response: Response,
    value: str,
    *,
    name: str = session.COOKIE,
    max_age: int = session.TTL_S,
) -> None:
    secure = https(request)
    response.set_cookie(
        cookie_name(request, name),
        value,
        max_age=max_age,
        path="/" if secure else url(request, ""),
        httponly=True,
        samesite="strict",
        secure=secure,
    )


def delete_cookie(request: Request, response: Response, name: str = session.COOKIE) -> None:
    """Expire cookie `name` with the attributes it was set with: a browser ignores a `__Host-`
    cookie, its expiry too, that is not Secure with Path=/."""
    secure = https(request)
    response.delete_cookie(
        cookie_name(request, name),
        path="/" if secure else url(request, ""),
        secure=secure,
        httponly=True,
        samesite="strict",
    )


def redirect(request: Request, path: str, **query: Any) -> RedirectResponse:
    return RedirectResponse(url(request, path, **query), status_code=303)


def format_ms(value: int | None) -> str:
    """A duration for people: 850 ms, 12.3 s, 4 m 05 s, 2 h 10 m, 3 d 4 h."""
    if value is None:
        return "-"
    if value < 1000:
        return f"{value} ms"
    seconds = value / 1000
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} m {sec:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} m"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def format_time(value: datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
