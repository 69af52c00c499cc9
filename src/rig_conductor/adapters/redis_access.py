"""What a Redis ACL user must be allowed, checked at start with harmless probes.

Each probe runs one command the process needs, on a key of its stream's name space that does
not exist, in a form that changes nothing (XADD NOMKSTREAM, SET XX, XACK of no entry, ...).
Redis checks the ACL before anything else, so a NOPERM answer names exactly what is missing,
and any other answer (no such key, NOGROUP, NOSCRIPT) means the command is allowed. The rules
that pass every probe are documented in the README ("Connecting to your Redis").
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from typing import Literal

from redis.asyncio import RedisCluster
from redis.exceptions import (
    AuthenticationError,
    NoPermissionError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from rig_conductor.adapters import redis_keys
from rig_conductor.adapters.redis_client import AnyRedis, is_clustered

Role = Literal["conductor", "agent"]

# The least-privilege ACL rules (`ACL SETUSER <name> <rules> ><password>`) for the key space of
# the default streams; the README shows them, and the tests run both roles with exactly these.
# For other streams, add their patterns (a stream, its `:dlq`, its `:dispatched:` markers and
# its `:epoch` marker).
CONDUCTOR_ACL = (
    "on resetkeys ~rig:* ~{rig:* ~assignments:* ~{assignments:* resetchannels -@all "
    "+ping +time +scan +type +exists +get +set +wait "
    "+xinfo|groups +xinfo|consumers +xpending +xclaim +xack +xadd +xrange +xrevrange +xdel "
    "+xgroup|delconsumer +evalsha +eval +script|load +script|exists"
)
AGENT_ACL = (
    "on resetkeys ~rig:* ~{rig:* ~assignments:* ~{assignments:* resetchannels -@all "
    "+ping +get +set +pexpire +del +hset +hgetall +hdel +expire +multi +exec "
    "+xreadgroup +xgroup|create +xgroup|createconsumer +xack +xpending +xrange +xadd "
    "+evalsha +eval +script|load +script|exists"
)
# In cluster mode both also need to read the cluster's layout.
CLUSTER_ACL_EXTRA = "+cluster|slots +cluster|shards +cluster|nodes +command +readonly"
_NO_SHA = "0" * 40
_GROUP, _CONSUMER = "rig-access-probe", "rig-access-probe"


def _probes(role: Role, key: str, dlq: str) -> list[tuple[str, ...]]:
    """(command, args...) per permission `role` needs; `key` and `dlq` do not exist. A
    command with a subcommand is named as one word pair ("SCRIPT LOAD"), as the cluster
    client routes it."""
    common: list[tuple[str, ...]] = [
        ("PING",),
        ("XPENDING", key, _GROUP, "-", "+", "1"),
        ("XACK", key, _GROUP, "0-1"),
        ("XADD", key, "NOMKSTREAM", "*", "probe", "1"),
        ("XADD", dlq, "NOMKSTREAM", "*", "probe", "1"),
        ("XRANGE", key, "-", "+", "COUNT", "1"),
        ("EVALSHA", _NO_SHA, "1", key),
        ("SCRIPT LOAD", "return 0"),
        ("SCRIPT EXISTS", _NO_SHA),
        ("GET", key),
        ("SET", key, "1", "XX"),
    ]
    if role == "agent":
        return [
            *common,
            ("XREADGROUP", "GROUP", _GROUP, _CONSUMER, "COUNT", "1", "STREAMS", key, "0"),
            ("XGROUP CREATE", key, _GROUP, "0"),
            ("XGROUP CREATECONSUMER", key, _GROUP, _CONSUMER),
            ("PEXPIRE", key, "1"),
            ("DEL", key),
            ("HGETALL", key),
            ("HDEL", key, "probe"),
            ("EXPIRE", key, "1"),
        ]
    return [
        *common,
        ("XINFO GROUPS", key),
        ("XINFO CONSUMERS", key, _GROUP),
        ("XCLAIM", key, _GROUP, _CONSUMER, "0", "0-1", "JUSTID"),
        ("XREVRANGE", dlq, "+", "-", "COUNT", "1"),
        ("XDEL", dlq, "0-1"),
        ("XGROUP DELCONSUMER", key, _GROUP, _CONSUMER),
        ("TYPE", key),
        ("EXISTS", key),
        ("SCAN", "0", "MATCH", key, "COUNT", "1", "TYPE", "stream"),
        ("WAIT", "0", "1"),
        ("TIME",),
    ]


def probe_key(stream: str) -> str:
    """A key in `stream`'s name space (same prefix, same hash tag) that nothing uses."""
    return f"{stream}:rig-access-probe"


async def missing_permission(client: AnyRedis, *, role: Role, streams: Sequence[str]) -> str | None:
    """None when the Redis user may run everything `role` needs on `streams`' keys; else one
    line naming the first missing permission. Connection errors propagate."""
    for stream in streams:
        if any(char in stream for char in "*?["):
            stream = stream.split("*")[0].split("?")[0].split("[")[0] or "rig"
        key = probe_key(stream)
        dlq = redis_keys.dlq_key(key, clustered=is_clustered(client))
        for command in _probes(role, key, dlq):
            options: dict[str, object] = {}
            if isinstance(client, RedisCluster) and key not in command and dlq not in command:
                options["target_nodes"] = RedisCluster.RANDOM  # a keyless command: any node
            try:
                await client.execute_command(*command, **options)
            except ResponseError as exc:
                if isinstance(exc, NoPermissionError) or str(exc).startswith("NOPERM"):
                    return _missing(role, command, exc, keys=(key, dlq))
    return None


def _missing(
    role: Role, command: tuple[str, ...], exc: ResponseError, *, keys: tuple[str, str]
) -> str:
    name = command[0]
    key = next((arg for arg in command if arg in keys), None)
    what = f"{name} on key {key}" if key and "key" in str(exc).lower() else name
    return f"Redis user lacks a permission the {role} needs: {what} ({exc})"


def describe_failure(exc: BaseException) -> str:
    """One line for an operator: which part of reaching Redis failed."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return f"Redis refused the credentials in RIG_REDIS_URL: {text}"
    if _is_certificate_problem(exc):
        return (
            "Redis TLS handshake failed (certificate rejected; RIG_REDIS_URL, "
            f"RIG_REDIS_TLS_CA_FILE): {text}"
        )
    if isinstance(exc, RedisConnectionError | OSError):
        return f"Redis unreachable (RIG_REDIS_URL): {text}"
    if isinstance(exc, RedisError):
        return f"Redis refused (RIG_REDIS_URL): {type(exc).__name__}: {text}"
    return f"Redis unreachable (RIG_REDIS_URL): {type(exc).__name__}: {text}"


def _is_certificate_problem(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "CERTIFICATE" in str(seen).upper():
            return True
        seen = seen.__cause__ or seen.__context__
    return False
