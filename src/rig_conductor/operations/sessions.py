"""Signing in and out of the console, beyond the signed cookie itself.

Signing out marks the session in Redis until it would have expired, so its cookie, replayed,
is refused on every replica; the cookie itself stays stateless. A failed sign-in leaves a
warning and an event-log row, and repeated failures from one address are slowed down.
"""

from __future__ import annotations

import json
import logging
import time

from rig_conductor import logs, roles, throttle
from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres import writes as pg_writes
from rig_conductor.adapters.redis import inspection as redis_inspect
from rig_conductor.domain import EventKind, StreamKey
from rig_conductor.runtime import Runtime

logger = logging.getLogger(logs.CONSOLE_LOGGER)


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
    """A sign-in with a token that is not valid: a warning (at a bounded rate) and an
    event-log row."""
    rt.refusal_log.log(
        logger,
        logging.WARNING,
        "Sign-in refused",
        "[Console] Sign-in refused from %s: not a valid token (%d failed in a row)",
        client,
        failures,
        extra={"client": client, "failures": failures},
    )
    row = queries.EventRow(
        EventKind.SIGN_IN_FAILED, detail=json.dumps({"client": client, "failures": failures})
    )
    await pg_writes.append_events(rt.engine, tenant=rt.settings.tenant, rows=[row])


# The sign-in throttle is the general one of failed credentials, one per process.
SignInThrottle = throttle.FailureThrottle
