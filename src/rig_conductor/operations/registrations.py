"""How many consumers an agent may register (RIG_MAX_CONSUMERS_PER_AGENT), on the heartbeat's
hot path.

A heartbeat naming a consumer this process heard lately for the same agent passes on a
dictionary lookup: no query. Only a consumer new here is looked up in the registry: one
already registered for the agent passes (known consumers keep being heard, whatever the
limit), and a new one passes while the agent holds fewer than the limit. The check and the
heartbeat that registers the consumer run under one lock per agent, so concurrent new
consumers of one agent cannot all slip in under the limit in this process. (Replicas check
apart: with R replicas, concurrent registrations of one agent can overshoot by at most R - 1.)

A consumer is remembered for RIG_AGENT_FORGET_MS after it was last heard here: the registry
forgets it no sooner, so a consumer remembered here is one the registry still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from rig_conductor.adapters.postgres.registrations import Standing
from rig_conductor.domain import AgentId, ConsumerName

# Looks up a consumer's standing in the registry: (agent, consumer, count up to) -> Standing.
LookUp = Callable[[AgentId, ConsumerName, int], Awaitable[Standing]]

MAX_REMEMBERED = 100_000


class ConsumerLimit:
    def __init__(
        self,
        look_up: LookUp,
        *,
        limit: int,
        remember_s: float,
        max_remembered: int = MAX_REMEMBERED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._look_up = look_up
        self.limit = limit
        self._remember_s = remember_s
        self._max_remembered = max_remembered
        self._clock = clock
        # consumer -> (its agent, when last heard here), least recently heard first.
        self._heard: OrderedDict[ConsumerName, tuple[AgentId, float]] = OrderedDict()
        # agent -> (its lock, how many hold or wait for it): dropped when nobody does.
        self._locks: dict[AgentId, tuple[asyncio.Lock, list[int]]] = {}

    def known(self, agent: AgentId, consumer: ConsumerName) -> bool:
        """Whether `consumer` was heard here lately for `agent` (then no check is needed)."""
        found = self._heard.get(consumer)
        if found is None or found[0] != agent:
            return False
        if self._clock() - found[1] >= self._remember_s:
            del self._heard[consumer]
            return False
        return True

    def heard(self, agent: AgentId, consumer: ConsumerName) -> None:
        """A heartbeat naming `consumer` for `agent` was stored."""
        self._heard[consumer] = (agent, self._clock())
        self._heard.move_to_end(consumer)
        while len(self._heard) > self._max_remembered:
            self._heard.popitem(last=False)

    async def refusal(self, agent: AgentId, consumer: ConsumerName) -> str | None:
        """Why `agent` may not register `consumer` (None: it may). Call under `admitting`."""
        standing = await self._look_up(agent, consumer, self.limit)
        if standing.registered or standing.consumers < self.limit:
            return None
        return (
            f"agent {agent} already has {self.limit} consumers, the most one agent may "
            f"register (RIG_MAX_CONSUMERS_PER_AGENT); consumer {consumer} is not one of them"
        )

    @contextlib.asynccontextmanager
    async def admitting(self, agent: AgentId) -> AsyncIterator[None]:
        """Held from the check of a new consumer until its heartbeat is stored."""
        lock, users = self._locks.setdefault(agent, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[agent]
