"""A redis-server of a test's own, without persistence: a restart starts it empty."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError

from tests.topologies.servers import Server, client, redis_args, wait_until


@dataclass
class RestartableRedis:
    """One redis-server of the test's own, without persistence: a restart starts it empty."""

    port: int
    directory: Path
    server: Server | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RestartableRedis:
        self.server = Server(self.port, self.directory, redis_args(self.port)).start()
        wait_until(lambda: client(self.port).ping(), what=f"redis-server on {self.port}")
        return self

    def restart_empty(self) -> None:
        """SHUTDOWN NOSAVE, then the same server again on the same port: nothing survives."""
        assert self.server is not None and self.server.process is not None
        with contextlib.suppress(RedisConnectionError):
            client(self.port).shutdown(nosave=True)
        self.server.process.wait(timeout=30)
        self.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
