"""The conductor's asyncio clients pack commands with hiredis, byte for byte as redis-py's own
Python packer does, whatever the scheme's connection class."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)

from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.settings import RigSettings

COMMANDS: list[tuple[Any, ...]] = [
    ("XCLAIM", "rig:dispatch", "workers", "qa-e-0", 300_000, "1-0", "2-0", "JUSTID"),
    ("XINFO CONSUMERS", "rig:dispatch", "workers"),
    ("SET", "ü-key", "é" * 3, b"\x00\xff", 10**20, 0.1, memoryview(b"abc")),
]


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:6379/0", Connection),
        ("rediss://127.0.0.1:6380/0", SSLConnection),
        ("unix:///tmp/redis.sock", UnixDomainSocketConnection),
    ],
)
def test_every_kind_of_connection_packs_with_hiredis(
    url: str, base: type[AbstractConnection]
) -> None:
    pool = redis_client.connect(RigSettings(redis_url=url)).connection_pool
    assert issubclass(pool.connection_class, redis_client._HiredisPacking)
    assert issubclass(pool.connection_class, base)
    ours, plain = pool.connection_class(**pool.connection_kwargs), Connection()
    for command in COMMANDS:
        assert b"".join(ours.pack_command(*command)) == b"".join(plain.pack_command(*command))
