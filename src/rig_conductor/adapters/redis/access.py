"""What a Redis ACL user must be allowed, checked at start with harmless probes.

Each probe runs one command the process needs, on a key of its stream's name space that does
not exist, in a form that changes nothing (XADD NOMKSTREAM, SET XX, XACK of no entry, ...).
Redis checks the ACL before anything else, so a NOPERM answer names exactly what is missing,
and any other answer (no such key, NOGROUP, NOSCRIPT) means the command is allowed. The rules
that pass every probe are the ones `rig-conductor redis-acl` prints (`redis_rights`).
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

from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis.client import AnyRedis, is_clustered

Role = Literal["conductor", "agent"]

# The users `rig-conductor redis-acl` prints (`redis_rights`) pass every probe of their role.
_NO_SHA = "0" * 40
_GROUP, _CONSUMER = "rig-access-probe", "rig-access-probe"


def _probes(role: Role, key: str, dlq: str) -> list[tuple[str, ...]]:
    """(command, args...) per permission the conductor needs; `key` and `dlq` do not exist. A
    command with a subcommand is named as one word pair ("SCRIPT LOAD"), as the cluster
    client routes it."""
    return [
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


def _agent_probes(stream: str, own: str) -> list[tuple[str, ...]]:
    """What an agent runs: on its stream itself (in forms that change nothing there: a group
    that does not exist, an id that is not one), and on a key of its own that does not exist."""
    return [
        ("PING",),
        ("XPENDING", stream, _GROUP, "-", "+", "1"),
        ("XACK", stream, _GROUP, "0-1"),
        ("XREADGROUP", "GROUP", _GROUP, _CONSUMER, "COUNT", "1", "STREAMS", stream, "0"),
        ("XGROUP CREATE", stream, _GROUP, "not-an-id"),
        ("XGROUP CREATECONSUMER", stream, _GROUP, _CONSUMER),
        ("SCRIPT LOAD", "return 0"),
        ("SCRIPT EXISTS", _NO_SHA),
        ("EVALSHA", _NO_SHA, "1", own),
        ("GET", own),
        ("SET", own, "1", "XX"),
        ("PTTL", own),
        ("PEXPIRE", own, "1"),
        ("DEL", own),
    ]


def probe_key(stream: str, *, clustered: bool = False) -> str:
    """A companion key of `stream` (its prefix, and its slot on a cluster) that nothing uses."""
    return f"{redis_keys.slot_prefix(stream, clustered=clustered)}:rig-access-probe"


async def missing_permission(
    client: AnyRedis, *, role: Role, streams: Sequence[str], agent_id: str = ""
) -> str | None:
    """None when the Redis user may run everything `role` needs on `streams`' keys (an agent:
    on its stream and its own keys, `agent_id`'s); else one line naming the first missing
    permission. Connection errors propagate."""
    for stream in streams:
        if role == "agent":
            own = redis_keys.agent_prefix(agent_id) + "rig-access-probe"
            missing = await _first_refused(client, role, _agent_probes(stream, own), (stream, own))
        else:
            if any(char in stream for char in "*?["):
                stream = stream.split("*")[0].split("?")[0].split("[")[0] or "rig"
            clustered = is_clustered(client)
            key = probe_key(stream, clustered=clustered)
            dlq = redis_keys.dlq_key(key, clustered=clustered)
            missing = await _first_refused(client, role, _probes(role, key, dlq), (key, dlq))
        if missing is not None:
            return missing
    return None


async def over_privileged(client: AnyRedis, *, stream: str) -> bool:
    """True when an agent's user may add entries to streams (XADD, tried where it changes
    nothing): it has the conductor's rights, as one user shared by the conductor and every
    agent does, and could forge dispatches, dead letters or markers."""
    try:
        probe = probe_key(stream, clustered=is_clustered(client))
        await client.execute_command("XADD", probe, "NOMKSTREAM", "*", "probe", "1")
    except ResponseError as exc:
        return not (isinstance(exc, NoPermissionError) or str(exc).startswith("NOPERM"))
    return True


async def _first_refused(
    client: AnyRedis, role: Role, probes: list[tuple[str, ...]], keys: tuple[str, str]
) -> str | None:
    for command in probes:
        options: dict[str, object] = {}
        if isinstance(client, RedisCluster) and not set(keys) & set(command):
            options["target_nodes"] = RedisCluster.RANDOM  # a keyless command: any node
        try:
            await client.execute_command(*command, **options)
        except ResponseError as exc:
            if isinstance(exc, NoPermissionError) or str(exc).startswith("NOPERM"):
                return _missing(role, command, exc, keys=keys)
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
