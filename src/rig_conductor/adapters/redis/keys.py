"""Names of the keys that live beside a stream.

A script touches the stream and its companions in one step, so on a Redis Cluster they must
share the stream's hash slot. There, a companion's name carries the stream's hash tag: the
stream's own tag when its name has one (`{orders}:new` -> `{orders}:new:dlq`), else the whole
stream name as the tag (`rig:dispatch` -> `{rig:dispatch}:dlq`). On one server (standalone or
behind sentinels) the names stay as they always were (`rig:dispatch:dlq`).
"""

from __future__ import annotations

from urllib.parse import quote

from rig_conductor.domain import StreamKey

DLQ_SUFFIX = ":dlq"
# The keys an agent writes live under this prefix and its agent id; nothing of the conductor's
# does, so an ACL key pattern can give each agent its own keys and nothing else.
AGENT_PREFIX = "rig:agent:"


class BadStreamName(ValueError):
    """A stream name no companion key can be made for here: a request naming it is the client's
    mistake (422, or a 400 page), never a 500."""


def has_hash_tag(name: str) -> bool:
    """True when Redis Cluster hashes only part of `name`: a `{...}` with something inside."""
    start = name.find("{")
    if start < 0:
        return False
    end = name.find("}", start + 1)
    return end > start + 1


def slot_prefix(stream: str, *, clustered: bool) -> str:
    """What a companion key of `stream` starts with, so that it hashes with the stream."""
    if not clustered or has_hash_tag(stream):
        return stream
    if "}" in stream:
        # `{a}b}:dlq` would hash `a}b` only up to the first `}`: no key can share the slot.
        raise BadStreamName(
            f"stream {stream!r} has a '}}' but no hash tag: on a Redis Cluster its dead letters "
            "cannot share its slot; name it with a hash tag, e.g. '{orders}:new'"
        )
    return "{" + stream + "}"


def dlq_key(stream: str, *, clustered: bool = False) -> StreamKey:
    """The dead-letter stream of `stream`."""
    return StreamKey(slot_prefix(stream, clustered=clustered) + DLQ_SUFFIX)


def dispatched_key(stream: str, key: str, *, clustered: bool = False) -> str:
    """The marker that an entry was appended to `stream` under idempotency key `key`."""
    return f"{slot_prefix(stream, clustered=clustered)}:dispatched:{key}"


def epoch_key(stream: str, *, clustered: bool = False) -> str:
    """The marker the conductor keeps beside `stream` and remembers in PostgreSQL: gone (or
    another) means Redis lost its data since, with this stream's slot on a cluster."""
    return f"{slot_prefix(stream, clustered=clustered)}:epoch"


def revoked_session_key(stream: str, nonce: str, *, clustered: bool = False) -> str:
    """The marker that the console session with `nonce` was signed out (kept until it would
    have expired), in the dispatch stream's name space: the ACL rules that let the conductor
    mark dispatches let it mark these."""
    return f"{slot_prefix(stream, clustered=clustered)}:console-revoked:{nonce}"


def is_dlq(name: str) -> bool:
    return name.endswith(DLQ_SUFFIX)


def agent_prefix(agent_id: str) -> str:
    """`rig:agent:<agentId>:`, the agent id percent-encoded (every byte but `A-Z a-z 0-9 _ . -
    ~`, as `%XX`): no `:` and no glob character is left in it, so the ACL pattern
    `rig:agent:<encoded>:*` matches this agent's keys and no other agent's (`dev-e`'s pattern
    does not reach `dev-e:x`'s keys, nor `dev-e-dotnet`'s)."""
    return f"{AGENT_PREFIX}{quote(agent_id, safe='')}:"


def lease_key(agent_id: str, stream: str, group: str, consumer: str) -> str:
    """The consumer-name lease of `consumer` reading `group` of `stream`, in its agent's keys."""
    return f"{agent_prefix(agent_id)}lease:{stream}:{group}:{consumer}"
