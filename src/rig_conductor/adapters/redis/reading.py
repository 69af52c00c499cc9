"""The scan's reading of Redis: the streams and groups of every node, read concurrently.

On one server (standalone or behind sentinels) this is one reading, and a failure fails the
scan as before. On a cluster each primary is read on its own: `RIG_STREAMS` patterns are
resolved on every primary, literal names on the node that holds them. One slow or failing node
does not stop the others: it is logged, counted and left for the next scan
(`Reading.go_on_without`, also for a node the scan's moves failed on). A slot that moved since
the slot map was read (MOVED or ASK) costs one re-read of the map and one retry
(`redis_client.retry_moved`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from rig_conductor.adapters.redis import streams as redis_streams
from rig_conductor.adapters.redis.client import (
    SLOT_MOVED,
    Node,
    Topology,
    retry_moved,
    split_by_node,
)
from rig_conductor.domain import GroupInfo, StreamKey

logger = logging.getLogger(__name__)


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

    def go_on_without(self, topology: Topology, node: str, exc: BaseException) -> None:
        """`node` failed (reading it, or acting on it). On a cluster it is logged and named in
        `failed`, and the next scan reads the slot map again (a failover may be under way): the
        other nodes go on. On one server, or when cancelled, `exc` is raised."""
        if not topology.clustered or isinstance(exc, asyncio.CancelledError):
            raise exc
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
        self.failed[node] = reason
        logger.warning(
            "Redis node %s left out of this scan, the other nodes go on: %s",
            node,
            reason,
            extra={"node": node},
        )
        topology.stale = True


async def read(
    topology: Topology,
    names: Sequence[str],
    *,
    others: int | None = None,
    only: str | None = None,
) -> Reading:
    """Every node's streams (from `names`: literal names and glob patterns) and groups (`only`:
    the groups of that name). With `others`, each group's consumers are a summary: those holding
    entries and the first `others` others (`redis_streams.describe_groups`)."""
    literals = [name for name in names if not redis_streams.is_pattern(name)]
    patterns = [name for name in names if redis_streams.is_pattern(name)]

    async def read_nodes() -> list[tuple[Node, NodeReading | BaseException]]:
        nodes = await topology.nodes()
        by_node = split_by_node(topology, literals)
        results = await asyncio.gather(
            *(
                _read_node(node, by_node.get(node.name, []), patterns, others, only)
                for node in nodes
            ),
            return_exceptions=True,
        )
        return list(zip(nodes, results, strict=True))

    answers = await retry_moved(
        topology,
        read_nodes,
        moved_in=lambda found: any(isinstance(result, SLOT_MOVED) for _, result in found),
    )
    reading = Reading()
    for node, result in answers:
        if isinstance(result, BaseException):
            reading.go_on_without(topology, node.name, result)
        else:
            reading.nodes.append(result)
    return reading


async def _read_node(
    node: Node, literals: list[str], patterns: list[str], others: int | None, only: str | None
) -> NodeReading:
    streams = await redis_streams.resolve_streams(node.client, names=[*literals, *patterns])
    groups = await redis_streams.describe_groups(
        node.client, streams=streams, others=others, only=only
    )
    return NodeReading(node, streams, groups)
