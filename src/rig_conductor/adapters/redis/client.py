"""One way to reach Redis, whatever the topology ("Redis topologies" in the contract).

`connect` gives the client the API, the agent runtime and the demo use: a `Redis` for a
standalone server or the master a set of sentinels names (it follows failovers by itself), a
`RedisCluster` for a cluster (it follows MOVED and ASK). `connect_sync` gives the same for the
audit's driver. `Topology` is what the reaper scans: the one server, or each primary of a
cluster through a plain client of its own, so that the existing scripts and pipelines run
unchanged where the keys live. Those plain clients do not follow MOVED and ASK: `raise_moved`
turns such a reply among a pipeline's into the error it is, and `retry_moved` and `on_owner` are
where that is decided (re-read the slot map, try once more).

Every client retries connection blips with jittered exponential backoff, and speaks TLS with
the configured CA and client certificate for `rediss://` URLs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import redis as redis_sync
from redis.asyncio import Redis, RedisCluster, Sentinel
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import HiredisRespSerializer, parse_url
from redis.exceptions import AskError, MovedError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis

from rig_conductor.settings_base import RigSettings

logger = logging.getLogger(__name__)

AnyRedis: TypeAlias = Redis | RedisCluster
AnySyncRedis: TypeAlias = redis_sync.Redis | redis_sync.RedisCluster

# Connection blips: up to 6 tries over about 5 s, then the error reaches the caller.
RETRIES = 6
_BACKOFF = {"base": 0.05, "cap": 2.0}
_RETRY_ON: tuple[type[RedisError], ...] = (RedisConnectionError, RedisTimeoutError)
# Errors that mean "the slot map is stale": re-read it and try again, once (`retry_moved`).
SLOT_MOVED = (MovedError, AskError)
T = TypeVar("T")


class _HiredisPacking:
    """Mixed into a client's connection class: commands are packed by hiredis, byte for byte
    as redis-py's blocking client packs them when hiredis is installed. The asyncio client packs
    in Python, a cost per argument that a scan pays once per entry it claims: an XCLAIM of
    1,000 ids took 470-730 µs to pack in Python and 62-65 µs with hiredis on the 2-core CI
    machine, so 0.5-0.7 µs of the 6.7 µs an entry that 150,000 reclaims a second allow."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):  # "XINFO CONSUMERS": one word an argument, as redis-py does
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:  # a memoryview or bytearray: redis-py's packer converts it, or says why
            packed: list[bytes] = self._packer.pack(*args)
            return packed


def _packing_with_hiredis(client: Redis) -> Redis:
    """`client`, its new connections packing commands with hiredis (when it is installed)."""
    pool = client.connection_pool
    base = pool.connection_class
    if HIREDIS_AVAILABLE and not issubclass(base, _HiredisPacking):
        pool.connection_class = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
    return client


class ClusterNodeClient(Redis):
    """A plain client to one primary of a cluster (`Topology`): keys it names must hash to
    that node, and companion keys carry the stream's hash tag (`redis_keys`)."""


class SentinelMasterClient(Redis):
    """The master a set of sentinels names; closing it closes the sentinel connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


class SyncSentinelMasterClient(redis_sync.Redis):
    """`SentinelMasterClient` for the audit's blocking client."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()


def is_clustered(client: AnyRedis) -> bool:
    """True when `client` talks to a Redis Cluster, whole or one node of it."""
    return isinstance(client, RedisCluster | ClusterNodeClient)


def redis_client_retry(retries: int = RETRIES) -> Retry:
    """Retry connection blips with jittered exponential backoff."""
    return Retry(ExponentialWithJitterBackoff(**_BACKOFF), retries, _RETRY_ON)


def _tls_options(settings: RigSettings) -> dict[str, Any]:
    if not settings.redis_url.startswith("rediss://"):
        return {}
    options: dict[str, Any] = {"ssl_cert_reqs": "required"}
    if settings.redis_tls_ca_file is not None:
        options["ssl_ca_certs"] = str(settings.redis_tls_ca_file)
    if settings.redis_tls_cert_file is not None and settings.redis_tls_key_file is not None:
        options["ssl_certfile"] = str(settings.redis_tls_cert_file)
        options["ssl_keyfile"] = str(settings.redis_tls_key_file)
    return options


def _common(settings: RigSettings) -> dict[str, Any]:
    return {
        "decode_responses": True,
        "socket_connect_timeout": 5,
        "health_check_interval": 30,
        **_tls_options(settings),
    }


def _credentials(settings: RigSettings) -> dict[str, Any]:
    """User, password and db of the URL: in sentinel mode the URL names no host."""
    parsed: dict[str, Any] = parse_url(settings.redis_url)  # type: ignore[no-untyped-call]
    return {name: parsed[name] for name in ("username", "password", "db") if name in parsed}


def _sentinel_options(settings: RigSettings) -> dict[str, Any]:
    options: dict[str, Any] = {"socket_connect_timeout": 5, "decode_responses": True}
    if settings.redis_sentinel_password is not None:
        options["password"] = settings.redis_sentinel_password.get_secret_value()
    if settings.redis_url.startswith("rediss://"):
        options["ssl"] = True
        options.update(_tls_options(settings))
    return options


def connect(settings: RigSettings) -> AnyRedis:
    """The client for the streams' Redis in the configured mode. Connects lazily."""
    common = _common(settings)
    if settings.redis_mode == "cluster":
        return RedisCluster.from_url(
            settings.redis_url,
            retry=redis_client_retry(),
            **common,
        )
    if settings.redis_mode == "sentinel":
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(settings.redis_sentinels),
            sentinel_kwargs=_sentinel_options(settings),
            retry=redis_client_retry(),
        )
        options: dict[str, Any] = {**common, **_credentials(settings)}
        if settings.redis_url.startswith("rediss://"):
            options["ssl"] = True
        client: Redis = sentinel.master_for(
            settings.redis_sentinel_master, redis_class=SentinelMasterClient, **options
        )
        return _packing_with_hiredis(client)
    return _packing_with_hiredis(
        Redis.from_url(settings.redis_url, retry=redis_client_retry(), **common)
    )


def connect_sync(settings: RigSettings, *, socket_timeout: float = 60) -> AnySyncRedis:
    """A blocking client in the configured mode, for the audit's driver."""
    common = {**_common(settings), "socket_timeout": socket_timeout}
    retry = SyncRetry(ExponentialWithJitterBackoff(**_BACKOFF), RETRIES, _RETRY_ON)
    if settings.redis_mode == "cluster":
        return redis_sync.RedisCluster.from_url(settings.redis_url, retry=retry, **common)
    if settings.redis_mode == "sentinel":
        sentinel = redis_sync.Sentinel(  # type: ignore[no-untyped-call]
            list(settings.redis_sentinels),
            sentinel_kwargs=_sentinel_options(settings),
            retry=retry,
        )
        options: dict[str, Any] = {**common, **_credentials(settings)}
        if settings.redis_url.startswith("rediss://"):
            options["ssl"] = True
        client: redis_sync.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            settings.redis_sentinel_master, redis_class=SyncSentinelMasterClient, **options
        )
        return client
    return redis_sync.Redis.from_url(settings.redis_url, retry=retry, **common)


@dataclass(frozen=True, slots=True)
class Node:
    """A server the reaper scans: its address, and a plain client of its own."""

    name: str
    client: Redis


class Topology:
    """The servers holding streams: the one server, or every primary of a cluster.

    A cluster's primaries each get a plain client (same credentials and TLS), so the scan's
    scripts and pipelines run on the node that holds the keys, and one slow node does not hold
    up the others. `refresh` re-reads the slot map after a MOVED or ASK.
    """

    def __init__(self, client: AnyRedis, settings: RigSettings | None = None) -> None:
        self.client = client
        self._settings = settings
        self._nodes: dict[str, Node] = {}
        # Set when a node failed: the next `nodes` re-reads the slot map (a failover may have
        # promoted a replica meanwhile).
        self.stale = False

    @property
    def clustered(self) -> bool:
        return isinstance(self.client, RedisCluster)

    async def nodes(self) -> list[Node]:
        if not isinstance(self.client, RedisCluster):
            return [Node("redis", self.client)]
        await self.client.initialize()
        if self.stale:
            try:
                await self.refresh()
            except Exception as exc:
                logger.info("Cluster slot map not re-read: %s: %s", type(exc).__name__, exc)
        primaries = {n.name: n for n in self.client.get_primaries()}
        for name in set(self._nodes) - set(primaries):
            await self._nodes.pop(name).client.aclose()
        for name, node in primaries.items():
            if name not in self._nodes:
                self._nodes[name] = Node(name, self._node_client(node.host, int(node.port)))
        return [self._nodes[name] for name in sorted(primaries)]

    def owner(self, key: str) -> str:
        """The node that holds `key` by the last slot map read ("redis" when not clustered).
        Call `nodes` once before: it reads the map."""
        if not isinstance(self.client, RedisCluster):
            return "redis"
        node = self.client.get_node_from_key(key)
        if node is None:
            raise LookupError(f"no cluster node holds the slot of {key}")
        return node.name

    async def refresh(self) -> None:
        if isinstance(self.client, RedisCluster):
            await self.client.nodes_manager.initialize()
            self.stale = False

    async def aclose(self) -> None:
        for node in self._nodes.values():
            await node.client.aclose()
        self._nodes.clear()

    def _node_client(self, host: str, port: int) -> Redis:
        if self._settings is None:
            raise ValueError("a cluster Topology needs the settings to reach each node")
        settings = self._settings
        options: dict[str, Any] = {
            **_common(settings),
            **{k: v for k, v in _credentials(settings).items() if k != "db"},
        }
        if settings.redis_url.startswith("rediss://"):
            options["ssl"] = True
        return _packing_with_hiredis(
            ClusterNodeClient(host=host, port=port, retry=redis_client_retry(2), **options)
        )


def split_by_node(topology: Topology, names: Sequence[str]) -> dict[str, list[str]]:
    """Literal key names grouped by the node that holds them."""
    grouped: dict[str, list[str]] = {}
    for name in names:
        grouped.setdefault(topology.owner(name), []).append(name)
    return grouped


async def node_for(topology: Topology, key: str) -> Node:
    """The node holding `key` now (after a `refresh`, the new owner)."""
    nodes = await topology.nodes()  # reads the slot map first, if never read
    owner = topology.owner(key)
    for node in nodes:
        if node.name == owner:
            return node
    raise LookupError(f"no primary named {owner} holds {key}")


def raise_moved(replies: Iterable[object]) -> None:
    """Raise the first MOVED or ASK among `replies` (a pipeline's, read with
    `raise_on_error=False`): the slot of a key they named moved since the slot map was read, and
    the caller's `retry_moved` or `on_owner` re-reads the map and tries once more where the keys
    live now. Every other error reply stays the caller's to judge: it says something about the
    key (no such group, not a stream), while a MOVED says only that the question went to the
    wrong server, so reading it as "skipped" or "failed" would drop the work the retry does."""
    for reply in replies:
        if isinstance(reply, SLOT_MOVED):
            raise reply


async def retry_moved(
    topology: Topology,
    work: Callable[[], Awaitable[T]],
    *,
    moved_in: Callable[[T], bool] | None = None,
) -> T:
    """`work()`; when the slot of a key it named moved since the slot map was read (MOVED or
    ASK), the map is read again and `work()` runs once more, where the keys live now. A second
    MOVED is the caller's. `moved_in`: for work that gathers the answers of several nodes,
    errors among them, whether its result holds a MOVED or ASK."""
    try:
        result = await work()
    except SLOT_MOVED:
        pass
    else:
        if moved_in is None or not moved_in(result):
            return result
    await topology.refresh()
    return await work()


async def on_owner(
    topology: Topology,
    key: str,
    work: Callable[[Redis], Awaitable[T]],
    *,
    client: Redis | None = None,
) -> T:
    """`work` with the client of the server holding `key` (`client`: one the caller knows holds
    it), then, after a MOVED or ASK, with the client of the server that holds it now."""
    known = [client] if client is not None else []

    async def attempt() -> T:
        owner = known.pop() if known else (await node_for(topology, key)).client
        return await work(owner)

    return await retry_moved(topology, attempt)
