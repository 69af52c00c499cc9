"""The consumer-name lease: a Redis key that says "this consumer name is in use".

Two processes reading with one consumer name would share one pending list, so an agent takes
the name's lease before it reads and renews it with its heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from redis.exceptions import RedisError

from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis import lua
from rig_conductor.adapters.redis.client import AnyRedis

logger = logging.getLogger(__name__)


class AgentError(Exception):
    """The agent cannot start or has to stop; the message is one line for the operator."""


class ConsumerInUse(AgentError):
    """Another live process reads with the same consumer name."""


class LeaseLost(AgentError):
    """Another process took the consumer name over while this one ran."""


def lease_key(agent_id: str, stream: str, group: str, consumer: str) -> str:
    """The lease key, among the agent's own keys (`redis_keys.agent_prefix`)."""
    return redis_keys.lease_key(agent_id, stream, group, consumer)


class ConsumerLease:
    """A Redis key that says "this consumer name is in use", kept alive with the heartbeats."""

    def __init__(self, client: AnyRedis, *, key: str, ttl_ms: int, poll_s: float = 0.1) -> None:
        self.key = key
        self.instance = uuid.uuid4().hex
        self._client = client
        self._ttl_ms = ttl_ms
        self._poll_s = poll_s

    async def acquire(self, until: asyncio.Event | None = None) -> bool:
        """Take the name. A holder whose key expires was a dead predecessor (a restarted pod);
        a holder that renews meanwhile is alive, and this process must not start.

        False when `until` was set while waiting.
        """
        first: str | None = None
        last_ttl: int | None = None
        deadline: float | None = None
        while until is None or not until.is_set():
            if await self._client.set(self.key, self.instance, nx=True, px=self._ttl_ms):
                return True
            holder, ttl = await self._client.eval(lua.LEASE_HOLDER, 1, self.key)
            if holder is None:
                continue
            if first is None:
                first, deadline = holder, time.monotonic() + max(ttl, 0) / 1000 + 1.0
                logger.info(
                    "Consumer name lease %s is held by instance %s for %d ms more; waiting",
                    self.key,
                    holder,
                    ttl,
                )
            renewed = last_ttl is not None and ttl > last_ttl + 50
            assert deadline is not None
            if holder != first or renewed or time.monotonic() > deadline:
                raise ConsumerInUse(
                    f"consumer name in use by another live process (lease {self.key} renewed "
                    f"by instance {holder}); give each process its own CONSUMER_ID"
                )
            last_ttl = ttl
            await asyncio.sleep(self._poll_s)
        return False

    async def renew(self) -> bool:
        """False when another instance holds the name now."""
        still_ours = await self._client.eval(
            lua.LEASE_RENEW, 1, self.key, self.instance, self._ttl_ms
        )
        return bool(still_ours)

    async def release(self) -> None:
        with contextlib.suppress(RedisError):
            await self._client.eval(lua.LEASE_RELEASE, 1, self.key, self.instance)
