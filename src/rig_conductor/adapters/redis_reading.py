"""The scan's reading of Redis: the streams and groups of every node, read concurrently.

On one server (standalone or behind sentinels) this is one reading, and a failure fails the
scan as before. On a cluster each primary is read on its own: `RIG_STREAMS` patterns are
resolved on every primary, literal names on the node that holds them. One slow or failing node
does not stop the others: it is logged, counted and left for the next scan. A slot that moved
since the slot map was read (MOVED or ASK) costs one re-read of the map and one retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from redis.exceptions import AskError, MovedError

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.redis_client import Node, Topology, split_by_node
from rig_conductor.domain import GroupInfo, StreamKey

logger = logging.getLogger(__name__)

# Errors that mean "the slot map is stale": re-read it and try again, once.
SLOT_MOVED = (MovedError, AskError)


@dataclass
class NodeReading:
    """What one node holds: its streams and their groups."""

    node: Node
    streams: list[StreamKey]
    groups: list[GroupInfo]


@dataclass
class Reading:
    nodes: list[NodeReading] = field(default_factory=list)
    # Nodes this scan could not read or act on, with the reason in one line.
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def streams(self) -> list[StreamKey]:
        return [stream for reading in self.nodes for stream in reading.streams]

    @property
    def groups(self) -> list[GroupInfo]:
        return [group for reading in self.nodes for group in reading.groups]

    def fail(self, node: str, exc: BaseException) -> None:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        self.failed[node] = reason
        logger.warning(
            "Redis node %s left out of this scan, the other nodes go on: %s",
            node,
            reason,
            extra={"node": node},
        )


async def read(topology: Topology, names: Sequence[str]) -> Reading:
    """Every node's streams (from `names`: literal names and glob patterns) and groups."""
    literals = [name for name in names if not redis_streams.is_pattern(name)]
    patterns = [name for name in names if redis_streams.is_pattern(name)]
    for attempt in (1, 2):
        nodes = await topology.nodes()
        by_node = split_by_node(topology, literals)
        results = await asyncio.gather(
            *(_read_node(node, by_node.get(node.name, []), patterns) for node in nodes),
            return_exceptions=True,
        )
        if attempt == 1 and any(isinstance(result, SLOT_MOVED) for result in results):
            await topology.refresh()
            continue
        break
    reading = Reading()
    for node, result in zip(nodes, results, strict=True):
        if isinstance(result, BaseException):
            if not topology.clustered or isinstance(result, asyncio.CancelledError):
                raise result
            reading.fail(node.name, result)
        else:
            reading.nodes.append(result)
    if reading.failed:
        topology.stale = True  # a failover may be under way: the next scan re-reads the map
    return reading


async def _read_node(node: Node, literals: list[str], patterns: list[str]) -> NodeReading:
    streams = await redis_streams.resolve_streams(node.client, names=[*literals, *patterns])
    groups = await redis_streams.describe_groups(node.client, streams=streams)
    return NodeReading(node, streams, groups)
