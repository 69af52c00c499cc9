"""Slows down a client that keeps presenting credentials that are not valid.

Pure bookkeeping over a clock: no I/O, and nothing on the path of a valid credential. Used by
the console's sign-in and the API's role guard; each keeps its own instance.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Failures:
    count: int
    last: float


class FailureThrottle:
    """Failed credentials (console sign-ins, API tokens) per client address, in this process.

    The first `free` failures in a row cost nothing; after that, each attempt must wait
    2^(n - free) s after the last failure (at most `max_wait_s`), and one made sooner is turned
    away. Both users look at the credential first and turn away only one that is not valid, so
    a valid one is never refused, and a valid one does not clear the client either (behind a
    proxy, a guesser shares its address with everyone). `succeeded`, or `forget_s` without a
    failure, clears the client; at most `max_clients` are kept, the least recently failing
    dropped first. Replicas count apart and a restart forgets: it slows guessing down,
    it does not lock anyone out for long. The client is its address, which is the proxy's
    unless the proxy is trusted (RIG_FORWARDED_ALLOW_IPS).
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
