"""Real Redis topologies, one of each per test session: a 6-node cluster, a master with a
replica and 3 sentinels, and a TLS-only server. Started on first use, killed at the end."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from rig_conductor import redis_rights
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.settings import Settings
from tests.e2e.fleet import AUDITED_TEST_S

from .servers import (
    Cluster,
    SentinelSet,
    Server,
    TlsServer,
    client,
    free_ports,
    redis_args,
    wait_until,
)

PASSWORD = "s3cret-acl"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/topologies/" in str(item.path):
            item.add_marker(pytest.mark.integration)
            # As the end-to-end tier: a core-loop test ends with a Spark audit, which takes
            # minutes, not seconds, on a loaded 2-core machine.
            item.add_marker(pytest.mark.timeout(AUDITED_TEST_S))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = Cluster(Path(tmp_path_factory.mktemp("cluster")))
    try:
        yield made.start()
    finally:
        made.close()


@pytest.fixture(scope="session")
def sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    made = SentinelSet(Path(tmp_path_factory.mktemp("sentinel")))
    try:
        yield made.start()
    finally:
        made.close()


@pytest.fixture(scope="session")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    made = TlsServer(Path(tmp_path_factory.mktemp("tls")))
    try:
        yield made.start()
    finally:
        made.close()


# The streams of the ACL server's users (the defaults), and the agents that get a user there.
ACL_STREAMS = ("rig:dispatch", "assignments:*")
ACL_AGENTS = ("builder-a", "builder-b", "a")


def acl_users(agent_ids: tuple[str, ...] = ACL_AGENTS) -> list[list[str]]:
    """The `ACL SETUSER` commands `rig-conductor redis-acl` prints for the ACL server, as
    argument lists, each switched on with the test password."""
    lines = redis_rights.setuser_lines(
        streams=ACL_STREAMS, dispatch_stream="rig:dispatch", agent_ids=agent_ids, clustered=False
    )
    return [[*line.split(), "on", f">{PASSWORD}"] for line in lines]


@pytest.fixture(scope="session")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A standalone server with the conductor's user and one per agent, exactly as
    `rig-conductor redis-acl` prints them, and the default user switched off."""
    (port,) = free_ports(1)
    server = Server(port, Path(tmp_path_factory.mktemp("acl")), redis_args(port)).start()
    try:
        wait_until(lambda: client(port).ping(), what="ACL server")
        admin = client(port)
        admin.execute_command("ACL", "SETUSER", "admin", "on", f">{PASSWORD}", "~*", "&*", "+@all")
        for command in acl_users():
            admin.execute_command(*command)
        admin.execute_command("ACL", "SETUSER", "default", "off")
        yield port
    finally:
        server.kill()


def acl_admin(port: int) -> Any:
    return client(port, username="admin", password=PASSWORD)


@pytest.fixture
def cluster_env(cluster: Cluster) -> dict[str, str]:
    """RIG_* settings that reach the cluster; the cluster is emptied first."""
    cluster.flush()
    return {"RIG_REDIS_MODE": "cluster", "RIG_REDIS_URL": cluster.url}


@pytest.fixture
def sentinel_env(sentinels: SentinelSet) -> dict[str, str]:
    from .servers import client

    client(sentinels.master_port()).flushall()
    return {
        "RIG_REDIS_MODE": "sentinel",
        "RIG_REDIS_URL": "redis:///0",
        "RIG_REDIS_SENTINELS": sentinels.sentinels,
    }


@pytest.fixture
def tls_env(tls_server: TlsServer) -> dict[str, str]:
    from .servers import client

    client(tls_server.port, ssl=True, ssl_ca_certs=str(tls_server.ca)).flushall()
    return {
        "RIG_REDIS_URL": tls_server.url,
        "RIG_REDIS_TLS_CA_FILE": str(tls_server.ca),
        "RIG_REDIS_TLS_CERT_FILE": str(tls_server.client_cert),
        "RIG_REDIS_TLS_KEY_FILE": str(tls_server.client_key),
    }


def env_settings(env: dict[str, str], database_url: str, **overrides: Any) -> Settings:
    fields = {name.removeprefix("RIG_").lower(): value for name, value in env.items()}
    return Settings(database_url=database_url, **{**fields, **overrides})


@pytest.fixture
def settings_for(database_url: str) -> Callable[..., Settings]:
    def build(env: dict[str, str], **overrides: Any) -> Settings:
        return env_settings(env, database_url, **overrides)

    return build


@pytest.fixture
async def cluster_client(cluster_env: dict[str, str], database_url: str) -> AsyncIterator[Any]:
    client = redis_client.connect(env_settings(cluster_env, database_url))
    yield client
    await client.aclose()


@pytest.fixture
async def sentinel_client(sentinel_env: dict[str, str], database_url: str) -> AsyncIterator[Redis]:
    client = redis_client.connect(env_settings(sentinel_env, database_url))
    assert isinstance(client, Redis)
    yield client
    await client.aclose()


@pytest.fixture
def cluster_envs(cluster_env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    return cluster_env, cluster_env


@pytest.fixture
def sentinel_envs(sentinel_env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The conductor waits for the replica on every dispatch."""
    return {**sentinel_env, "RIG_REDIS_WAIT_REPLICAS": "1"}, sentinel_env


@pytest.fixture
def tls_envs(tls_env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    return tls_env, tls_env


@pytest.fixture
def acl_envs(acl_server: int) -> tuple[dict[str, str], dict[str, str]]:
    acl_admin(acl_server).flushall()
    base = f"127.0.0.1:{acl_server}/0"
    return (
        {"RIG_REDIS_URL": f"redis://rig-conductor:{PASSWORD}@{base}"},
        # Each agent its own user: `{agent}` is its agent id (`agent_url`).
        {"RIG_REDIS_URL": f"redis://rig-agent-{{agent}}:{PASSWORD}@{base}"},
    )


def agent_url(url: str, agent_id: str) -> str:
    """An agents' URL of a topology's envs for one agent (its own user where each has one)."""
    return url.replace("{agent}", agent_id)
