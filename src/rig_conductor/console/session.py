"""Console sessions: a signed cookie after signing in with a token, and CSRF tokens.

The cookie holds who signed in (the token's fingerprint, never the token), an expiry and a
random nonce, signed with a key derived (HMAC) from the server's secret, RIG_SESSION_SECRET,
and the token: it cannot be forged without both, every replica with the same secret can check
it, and removing the token from the settings ends its sessions. A token moved to another role
no longer matches its sessions: its holder signs in again. Signing out ends a session before
its expiry (`operations.sessions`). With no tokens configured at all the console is open, as
the API is: sessions are anonymous operators.

CSRF: every change carries `csrf`, an HMAC of the session's nonce; the cookie is HttpOnly and
SameSite=Strict besides, and Secure over https. The sign-in form has one too, before there is a
session: an HMAC of a random nonce kept in a cookie of its own (`PRE_COOKIE`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

from rig_conductor import roles

COOKIE = "rig_session"
PRE_COOKIE = "rig_signin"
TTL_S = 8 * 3600
PRE_TTL_S = 3600


@dataclass(frozen=True, slots=True)
class Session:
    caller: roles.Caller
    expires: int
    nonce: str
    key: bytes

    @property
    def csrf(self) -> str:
        return hmac.new(self.key, b"csrf:" + self.nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


def _key(tokens: roles.Tokens, token: bytes | None) -> bytes:
    if token is None:
        return tokens.derive(b"rig-console-anonymous")
    return tokens.derive(b"rig-console-session", token)


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_in(tokens: roles.Tokens, presented: str) -> tuple[Session, str] | None:
    """A new session and its cookie value for a valid token; None for an unknown one, and for a
    token bound to one agent: it may report that agent's events, never use the console."""
    raw = presented.strip().encode()
    caller = tokens.caller(raw)
    if caller is None or caller.binding is not None:
        return None
    return _issue(caller, _key(tokens, raw))


def anonymous(tokens: roles.Tokens) -> tuple[Session, str]:
    """An open console's session (no tokens configured anywhere)."""
    return _issue(roles.ANONYMOUS, _key(tokens, None))


def _issue(caller: roles.Caller, key: bytes) -> tuple[Session, str]:
    session = Session(caller, int(time.time()) + TTL_S, secrets.token_urlsafe(16), key)
    payload = _b64(json.dumps({"w": caller.who, "e": session.expires, "n": session.nonce}).encode())
    signature = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    return session, f"{payload}.{signature}"


def read(tokens: roles.Tokens, cookie: str | None) -> Session | None:
    """The session a cookie carries, if its signature holds, it has not expired, and its token
    is still configured."""
    if not cookie or "." not in cookie:
        return None
    payload, _, signature = cookie.partition(".")
    try:
        data = json.loads(_unb64(payload))
        who, expires, nonce = str(data["w"]), int(data["e"]), str(data["n"])
        presented = _unb64(signature)
    except (ValueError, KeyError, TypeError):
        return None
    if tokens.open:
        if who != roles.ANONYMOUS.who:
            return None
        token, caller = None, roles.ANONYMOUS
    else:
        token = tokens.token_for(who)
        if token is None:
            return None
        found = tokens.caller(token)
        if found is None:
            return None
        caller = found
    key = _key(tokens, token)
    expected = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(presented, expected) or expires < time.time():
        return None
    return Session(caller, expires, nonce, key)


def pre_session(cookie: str | None) -> str:
    """The sign-in form's nonce: the one its cookie already holds, else a new one."""
    if cookie and 16 <= len(cookie) <= 64 and cookie.replace("-", "").replace("_", "").isalnum():
        return cookie
    return secrets.token_urlsafe(24)


def sign_in_csrf(tokens: roles.Tokens, nonce: str) -> str:
    """The CSRF token of the sign-in form shown with pre-session `nonce`."""
    return tokens.derive(b"rig-console-signin-csrf", nonce.encode()).hex()


def sign_in_csrf_ok(tokens: roles.Tokens, cookie: str | None, presented: str | None) -> bool:
    if not cookie or not presented:
        return False
    return hmac.compare_digest(presented.encode(), sign_in_csrf(tokens, cookie).encode())
