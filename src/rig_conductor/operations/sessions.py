"""Signing in and out of the console, beyond the signed cookie itself.

Signing out marks the session in Redis until it would have expired, so its cookie, replayed,
is refused on every replica; the cookie itself stays stateless. A failed sign-in leaves a
warning and an event-log row, and repeated failures from one address are slowed down.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rig_conductor import roles
from rig_conductor.adapters import redis_inspect
from rig_conductor.adapters.postgres import queries
from rig_conductor.domain import StreamKey
from rig_conductor.runtime import Runtime

logger = logging.getLogger("rig_conductor.console")


async def sign_out(rt: Runtime, caller: roles.Caller, *, nonce: str, expires: int) -> None:
    """End the session with `nonce` (which expires at `expires`, Unix seconds) now."""
    ttl_ms = int((expires - time.time()) * 1000)
    if ttl_ms > 0:
        await redis_inspect.revoke_session(
            rt.redis, stream=StreamKey(rt.settings.dispatch_stream), nonce=nonce, ttl_ms=ttl_ms
        )
    logger.info("[Console] %s signed out", caller.who)


async def signed_out(rt: Runtime, *, nonce: str) -> bool:
    """Whether the session with `nonce` was signed out."""
    return await redis_inspect.session_revoked(
        rt.redis, stream=StreamKey(rt.settings.dispatch_stream), nonce=nonce
    )


async def sign_in_failed(rt: Runtime, *, client: str, failures: int) -> None:
    """A sign-in with a token that is not valid: a warning and an event-log row."""
    logger.warning(
        "[Console] Sign-in refused from %s: not a valid token (%d failed in a row)",
        client,
        failures,
        extra={"client": client, "failures": failures},
    )
    row = queries.EventRow(
        "SIGN_IN_FAILED", detail=json.dumps({"client": client, "failures": failures})
    )
    await queries.append_events(rt.engine, tenant=rt.settings.tenant, rows=[row])


@dataclass(slots=True)
class _Failures:
    count: int
    last: float


class SignInThrottle:
    """Failed sign-ins per client address, in this process.

    The first `free` failures in a row cost nothing; after that, each attempt must wait
    2^(n - free) s after the last failure (at most `max_wait_s`), and one made sooner is turned
    away without its token being looked at. A success, or `forget_s` without a failure, clears
    the client. Replicas count apart and a restart forgets: it slows guessing down, it does not
    lock anyone out for long (behind a proxy every client may share one address).
    """

    def __init__(
        self,
        *,
        free: int = 3,
        max_wait_s: float = 60.0,
        forget_s: float = 900.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free, self.max_wait_s, self.forget_s = free, max_wait_s, forget_s
        self.max_clients = max_clients
        self.clock = clock
        self._seen: OrderedDict[str, _Failures] = OrderedDict()

    def wait_s(self, client: str) -> float:
        """How long `client` must still wait before its next attempt (0: go ahead)."""
        record = self._seen.get(client)
        if record is None:
            return 0.0
        since = self.clock() - record.last
        if since >= self.forget_s:
            del self._seen[client]
            return 0.0
        if record.count < self.free:
            return 0.0
        wait = min(self.max_wait_s, 2.0 ** (record.count - self.free))
        return max(0.0, wait - since)

    def failed(self, client: str) -> int:
        """Count a failure; the failures of `client` in a row."""
        now = self.clock()
        record = self._seen.pop(client, None)
        if record is None or now - record.last >= self.forget_s:
            record = _Failures(0, now)
        record.count += 1
        record.last = now
        self._seen[client] = record  # most recent last
        while len(self._seen) > self.max_clients:
            self._seen.popitem(last=False)
        return record.count

    def succeeded(self, client: str) -> None:
        self._seen.pop(client, None)
