"""The operator commands' one seam to the conductor: its URL and token from the environment,
and a request that either returns the API's JSON or ends the command with one line.

Configuration mistakes exit 2 naming the variable; a refusal (401, 403, 404, 409, 422) or a
conductor that cannot be reached exits 1 with one line. Never a traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rig_conductor.agent.token_file import TokenFileError, read_token

if TYPE_CHECKING:
    import httpx

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
TIMEOUT_S = 30.0


class Stop(Exception):
    """Ends the command: `message` on stderr (one line), `code` as the exit status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    token: str | None


def target(environ: Mapping[str, str] | None = None) -> Target:
    """RIG_CONDUCTOR_URL (default http://localhost:8080) and RIG_API_TOKEN or
    RIG_API_TOKEN_FILE (not both); `Stop` (exit 2) naming the variable that is wrong."""
    import httpx  # here, not at the top: every rig-conductor command loads this module

    env = os.environ if environ is None else environ
    raw = env.get("RIG_CONDUCTOR_URL", "").strip() or "http://localhost:8080"
    try:
        url = httpx.URL(raw)
    except httpx.InvalidURL:
        raise Stop(EXIT_USAGE, f"RIG_CONDUCTOR_URL: {raw!r} is not a URL") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise Stop(EXIT_USAGE, "RIG_CONDUCTOR_URL: must be an http:// or https:// URL with a host")
    token = env.get("RIG_API_TOKEN", "").strip() or None
    token_file = env.get("RIG_API_TOKEN_FILE", "").strip()
    if token_file:
        if token is not None:
            raise Stop(EXIT_USAGE, "RIG_API_TOKEN_FILE: set it or RIG_API_TOKEN, not both")
        try:
            token = read_token(Path(token_file))
        except TokenFileError as exc:
            raise Stop(EXIT_USAGE, f"RIG_API_TOKEN_FILE: {exc}") from None
    return Target(raw.rstrip("/"), token)


def call(
    method: str,
    path: str,
    *,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
) -> Any:
    """The API's JSON answer (None for 204), or `Stop` with one line saying why not."""
    import httpx

    where = target()
    headers = {"Authorization": f"Bearer {where.token}"} if where.token else {}
    query = {k: v for k, v in (params or {}).items() if v is not None}
    try:
        with httpx.Client(base_url=where.url, timeout=TIMEOUT_S) as client:
            answer = client.request(method, path, params=query, json=json, headers=headers)
    except httpx.HTTPError as exc:
        raise Stop(EXIT_REFUSED, f"cannot reach {where.url} (RIG_CONDUCTOR_URL): {exc}") from None
    if answer.status_code >= 400:
        raise Stop(EXIT_REFUSED, f"{answer.status_code}: {_detail(answer)}")
    if answer.status_code == 204 or not answer.content:
        return None
    return answer.json()


def _detail(answer: httpx.Response) -> str:
    try:
        body = answer.json()
    except ValueError:
        return answer.reason_phrase or "refused"
    detail = body.get("detail") if isinstance(body, dict) else None
    text = str(detail) if detail else answer.reason_phrase or "refused"
    return " ".join(text.split())
