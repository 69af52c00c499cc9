"""Integration tier: every test here talks to a real Redis and/or PostgreSQL."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings
from tests import redis_kit
from tests.topologies.servers import REDIS_SERVER, free_ports, require_binaries

from .console_kit import builder, client_of
from .restartable import RestartableRedis


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(params=["primary", "redis-6.2"])
async def any_redis(
    request: pytest.FixtureRequest, redis_urls: dict[str, str]
) -> AsyncIterator[Redis]:
    """The test runs once per distinct Redis version at hand (6.2 and 7.x in CI's
    `make test-servers`). On embedded servers the primary Redis is the 6.2 itself: the second
    run would repeat the first, so it skips, CI or not (nothing is missing)."""
    if request.param not in redis_urls:
        pytest.skip("the primary Redis is the embedded 6.2 already (set RIG_TEST_REDIS_URL)")
    client = redis_kit.connect(redis_urls[request.param])
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def build(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> Callable[..., FastAPI]:
    """The conductor's app as `console_kit.builder` makes it, on the test's Redis and database
    (both emptied first); a module may define its own `build`."""
    return builder(make_settings)


@pytest.fixture
async def console(build: Callable[..., FastAPI]) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `build()`'s app over ASGI, its lifespan running; not signed in."""
    async for client in client_of(build()):
        yield client


@pytest.fixture
def restartable_redis() -> Iterator[RestartableRedis]:
    """A redis-server of the test's own, without persistence, that the test may restart empty."""
    require_binaries(REDIS_SERVER)
    with tempfile.TemporaryDirectory(prefix="rig-redis-restart-") as directory:
        (port,) = free_ports(1)
        redis = RestartableRedis(port, Path(directory))
        try:
            yield redis.start()
        finally:
            redis.stop()
