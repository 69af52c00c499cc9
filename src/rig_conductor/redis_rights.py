"""The least-privilege Redis users, as `ACL SETUSER` rules (`rig-conductor redis-acl`).

One user for the conductor, and one per agent. An agent reads its streams with its group, acks,
and keeps its own keys (`rig:agent:<agentId>:*`: the consumer-name lease); it cannot add to a
stream, claim, delete or trim entries, touch any key of the conductor's (dispatch markers,
epochs, dead-letter streams, console sessions) or of another agent, and asks the conductor to
dead-letter. Redis 7 ACL selectors give the agent's own keys their own commands. The rules are
pure text from the settings; `adapters.redis.access` checks at start that a user has what its
role needs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rig_conductor import domain
from rig_conductor.adapters.redis import keys as redis_keys

if TYPE_CHECKING:
    from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

CONDUCTOR_USER = "rig-conductor"
AGENT_USER_PREFIX = "rig-agent-"

# What the conductor runs: scans, moves, dispatches, dead letters, markers, the audit's reads.
CONDUCTOR_COMMANDS = (
    "+ping +select +time +scan +type +exists +get +set +wait "
    "+xinfo|groups +xinfo|consumers +xinfo|stream +xpending +xclaim +xack +xadd +xrange "
    "+xrevrange +xdel +xgroup|delconsumer +evalsha +eval +script|load +script|exists"
)
# In cluster mode both roles also read the cluster's layout.
CLUSTER_COMMANDS = "+cluster|slots +cluster|shards +cluster|nodes +command +readonly"
# What an agent runs on its streams (keyless ones too: they are allowed whatever the key).
AGENT_STREAM_COMMANDS = (
    "+ping +select +xreadgroup +xgroup|create +xgroup|createconsumer +xack +xpending "
    "+script|load +script|exists"
)
# What an agent runs on its own keys only: the consumer-name lease.
AGENT_OWN_COMMANDS = "+get +set +pttl +pexpire +del +eval +evalsha"
# Every line starts from no rights and no keys, but keeps the user's passwords: applying the
# rules again (after a change of RIG_STREAMS, say) leaves rotation to `>new` / `<old`.
_RESET = "resetkeys resetchannels -@all clearselectors"


def stream_specs(streams: Iterable[str], dispatch_stream: str) -> list[str]:
    """The stream names and patterns the users cover: RIG_STREAMS and the dispatch stream."""
    seen: dict[str, None] = {}
    for spec in (dispatch_stream, *streams):
        if spec:
            seen.setdefault(spec, None)
    return list(seen)


def conductor_keys(specs: Sequence[str]) -> list[str]:
    """Each stream and its companions (`<stream>:dlq`, `:dispatched:`, `:epoch`, ...), in the
    form a cluster gives them too (`{<stream>}:...`)."""
    patterns: dict[str, None] = {}
    for spec in specs:
        patterns.setdefault(spec, None)
        patterns.setdefault(f"{spec}:*", None)
        if not redis_keys.has_hash_tag(spec):
            patterns.setdefault(f"{{{spec}}}:*", None)
    return [f"~{pattern}" for pattern in patterns]


def conductor_rules(specs: Sequence[str], *, clustered: bool = False) -> str:
    extra = f" {CLUSTER_COMMANDS}" if clustered else ""
    return f"{_RESET} {' '.join(conductor_keys(specs))} {CONDUCTOR_COMMANDS}{extra}"


def agent_rules(agent_id: str, specs: Sequence[str], *, clustered: bool = False) -> str:
    """Its streams with the stream commands; its own keys, in a selector, with the lease's."""
    keys = " ".join(f"~{spec}" for spec in specs)
    own = f"(~{redis_keys.agent_prefix(agent_id)}* {AGENT_OWN_COMMANDS})"
    extra = f" {CLUSTER_COMMANDS}" if clustered else ""
    return f"{_RESET} {keys} {AGENT_STREAM_COMMANDS}{extra} {own}"


def agent_user(agent_id: str) -> str:
    return f"{AGENT_USER_PREFIX}{agent_id}"


def setuser_lines(
    *, streams: Iterable[str], dispatch_stream: str, agent_ids: Sequence[str], clustered: bool
) -> list[str]:
    """`ACL SETUSER` for the conductor and each agent, without a password."""
    specs = stream_specs(streams, dispatch_stream)
    lines = [f"ACL SETUSER {CONDUCTOR_USER} {conductor_rules(specs, clustered=clustered)}"]
    for agent_id in agent_ids:
        rules = agent_rules(agent_id, specs, clustered=clustered)
        lines.append(f"ACL SETUSER {agent_user(agent_id)} {rules}")
    return lines


def overlapping_patterns(specs: Sequence[str]) -> list[str]:
    """Stream patterns that also match their streams' companions on one server (`assignments:*`
    matches `assignments:a:dlq`): an agent holding such a pattern may create a group on a
    dead-letter stream, though nothing else there. Name streams exactly to close it."""
    return [spec for spec in specs if any(c in spec for c in "*?[") and not spec.startswith("{")]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `redis-acl` on the `rig-conductor` subcommands."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "redis-acl",
        help="print the least-privilege Redis users (ACL SETUSER, without passwords)",
        description="Prints one ACL SETUSER command per line: the conductor's user, and one "
        "per --agent-id. Add `on >password` (or `#<sha256>`) to each before applying it. The "
        "rules follow RIG_STREAMS, RIG_DISPATCH_STREAM and RIG_REDIS_MODE; Redis 7 or newer.",
    )
    parser.add_argument(
        "--agent-id",
        action="append",
        default=[],
        dest="agent_ids",
        metavar="ID",
        help="an agent to make a user for (rig-agent-<ID>); repeat for more",
    )
    parser.set_defaults(command=_command)
    return parser


def _command(args: argparse.Namespace, settings: Settings) -> int:
    for agent_id in args.agent_ids:
        try:
            domain.name(agent_id)
        except ValueError as exc:
            print(f"rig-conductor: --agent-id {agent_id!r} {exc}", file=sys.stderr)
            return 2
        if any(char.isspace() for char in agent_id):
            print(
                f"rig-conductor: --agent-id {agent_id!r}: a Redis user name holds no spaces",
                file=sys.stderr,
            )
            return 2
    specs = stream_specs(settings.streams, settings.dispatch_stream)
    for line in setuser_lines(
        streams=settings.streams,
        dispatch_stream=settings.dispatch_stream,
        agent_ids=args.agent_ids,
        clustered=settings.redis_mode == "cluster",
    ):
        print(line)
    if args.agent_ids and (loose := overlapping_patterns(specs)):
        logger.warning(
            "RIG_STREAMS pattern(s) %s also match their streams' dead-letter streams and markers "
            "on one server: agents may create a consumer group there (nothing more). Name the "
            "streams agents read exactly to close it.",
            ", ".join(loose),
        )
    return 0
