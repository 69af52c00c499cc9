"""Console sessions: a signed cookie after signing in with a token, and CSRF tokens.

The cookie holds who signed in (the token's fingerprint, never the token), an expiry and a
random nonce, signed with a key derived from the token itself: it cannot be forged without the
token, every replica can check it, and removing the token from the settings ends its sessions.
A token moved to another role no longer matches its sessions: its holder signs in again.
With no tokens configured at all the console is open, as the API is: sessions are anonymous
operators signed with a key of this process.

CSRF: every change carries `csrf`, an HMAC of the session's nonce; the cookie is HttpOnly and
SameSite=Strict besides, and Secure over https.
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
TTL_S = 8 * 3600
_PROCESS_KEY = secrets.token_bytes(32)


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


def _key(token: bytes | None) -> bytes:
    if token is None:
        return _PROCESS_KEY
    return hashlib.sha256(b"rig-console-session\0" + token).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_in(tokens: roles.Tokens, presented: str) -> tuple[Session, str] | None:
    """A new session and its cookie value for a valid token; None for an unknown one."""
    raw = presented.strip().encode()
    caller = tokens.caller(raw)
    if caller is None:
        return None
    return _issue(caller, _key(raw))


def anonymous() -> tuple[Session, str]:
    """An open console's session (no tokens configured anywhere)."""
    return _issue(roles.ANONYMOUS, _key(None))


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
    key = _key(token)
    expected = hmac.new(key, payload.encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(presented, expected) or expires < time.time():
        return None
    return Session(caller, expires, nonce, key)
