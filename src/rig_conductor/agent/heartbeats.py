"""The agent's heartbeat loop: renew the consumer-name lease and heartbeat the conductor, every
RIG_HEARTBEAT_INTERVAL_S, for as long as the agent runs.

A heartbeat with no answer within the interval is reported, and left to finish within the HTTP
client's own timeout, not cancelled: a conductor slow to answer (just started, under load) still
stores it then, whereas a request cancelled before the conductor read it is lost, and enough of
those make a live agent look down (reaper rule 3, docs/rules.md). The lease is renewed on time
all the same. One heartbeat at a time: the next starts once it has ended. An unexpected error,
or a cancellation leaked out of a client, is logged and the loop beats on; should the loop end
all the same, the agent stops (`ended`): an agent that worked on unheard would be judged down
with its entries in hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from redis.exceptions import RedisError

from rig_conductor.agent.conductor import ConductorRejected, ConductorUnavailable
from rig_conductor.agent.lease import ConsumerLease

logger = logging.getLogger(__name__)


class HeartbeatLoop:
    """`run` until `close`; `lease_lost` once another process holds the consumer name (then
    `stop` is set)."""

    def __init__(
        self,
        *,
        lease: ConsumerLease,
        beat: Callable[[], Coroutine[Any, Any, None]],
        interval_s: float,
        consumer: str,
        stop: asyncio.Event,
    ) -> None:
        self._lease = lease
        self._beat = beat
        self._interval_s = interval_s
        self._consumer = consumer
        self._stop = stop
        self.lease_lost = False
        # The loop's own end. Cancelling it is not enough: a cancellation that lands as a call
        # ends can be swallowed beneath it (in the Redis or the HTTP client), and the loop would
        # beat on for ever.
        self._closing = False

    def close(self) -> None:
        self._closing = True

    async def run(self) -> None:
        interval = self._interval_s
        beat: asyncio.Task[None] | None = None
        try:
            while not self._closing:
                if not await self._renew():
                    return
                if beat is not None and beat.done():  # a late one, ended since
                    _outcome(beat, interval)
                    beat = None
                late = beat is not None  # still in flight, and reported as late already
                if beat is None:
                    beat = asyncio.create_task(self._beat(), name="rig-agent-heartbeat")
                done, _ = await asyncio.wait({beat}, timeout=interval)
                if done:
                    _outcome(beat, interval)
                    beat = None
                elif not late:
                    logger.warning(
                        "Heartbeat not answered within %.1fs; left to finish, the next waits",
                        interval,
                    )
                await asyncio.sleep(interval)
        finally:
            if beat is not None:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)

    def ended(self, task: asyncio.Task[None]) -> None:
        """The done-callback of `run`'s task: a loop that ended before `close` (whatever ended
        it) stops the agent."""
        if self._closing or self._stop.is_set():
            return
        why = "cancelled" if task.cancelled() else repr(task.exception())
        logger.error("The heartbeat loop ended (%s): stopping the agent", why)
        self._stop.set()

    async def _renew(self) -> bool:
        """Renew the lease; False (and `stop` set) when another process holds the name now."""
        try:
            if not await self._lease.renew():
                logger.error(
                    "Consumer name %s is held by another process now; stopping", self._consumer
                )
                self.lease_lost = True
                self._stop.set()
                return False
        except RedisError as exc:
            logger.warning("Could not renew the consumer-name lease: %s", exc)
        except Exception:
            logger.exception("Could not renew the consumer-name lease")
        except asyncio.CancelledError:
            if _cancelling():
                raise
            logger.warning("Could not renew the consumer-name lease: cancelled beneath the loop")
        return True


def _cancelling() -> bool:
    """Whether someone asked to cancel the running task. A CancelledError without that leaked
    out of a client's own timeout handling, and ends nothing."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _outcome(beat: asyncio.Task[None], interval: float) -> None:
    """Log a heartbeat that failed."""
    if beat.cancelled():  # not by `run`, which cancels only at its end: leaked out of a client
        logger.warning("Heartbeat cancelled before its answer; the next in %.1fs", interval)
        return
    try:
        beat.result()
    except (ConductorUnavailable, ConductorRejected) as exc:
        logger.warning("Heartbeat failed: %s", exc)
    except Exception:
        logger.exception("Heartbeat failed unexpectedly; the next in %.1fs", interval)
