"""Console sessions that end before their time: signing out marks the session in Redis until it
would have expired, so its cookie, replayed, is refused on every replica.

The cookie itself stays stateless (signed, with an expiry); only sign-outs are stored.
"""

from __future__ import annotations

import logging
import time

from rig_conductor import roles
from rig_conductor.adapters import redis_inspect
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
