"""Dispatching an issue (ISSUE_ASSIGNED): one entry on RIG_DISPATCH_STREAM per idempotency key,
recorded in PostgreSQL. The API route parses, authorises and answers; nothing here knows HTTP.

Append first, atomically and at most once per key (in Redis, beside the stream); then record it
in PostgreSQL, also at most once. A crash or an outage between the two leaves the record for
the retry to complete, never a second entry. With RIG_REDIS_WAIT_REPLICAS, the dispatch waits
until that many replicas hold the entry, and says how many did.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rig_conductor.adapters.postgres import dispatches
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis import writes as redis_writes
from rig_conductor.domain import EntryId, EventKind, StreamKey
from rig_conductor.runtime import Runtime

logger = logging.getLogger(__name__)
# How long a dispatch waits for RIG_REDIS_WAIT_REPLICAS replicas before it gives up on them.
WAIT_TIMEOUT_MS = 5_000


@dataclass(frozen=True, slots=True)
class Assignment:
    """An ISSUE_ASSIGNED as the client sent it."""

    issue_id: str
    agent_id: str
    payload: dict[str, Any]
    idempotency_key: str | None = None

    @property
    def key(self) -> str:
        """What makes a repeat a repeat: the client's idempotency key, else the issue id."""
        return self.idempotency_key or self.issue_id


@dataclass(frozen=True, slots=True)
class Dispatched:
    stream: StreamKey
    entry_id: EntryId
    # False: the key was dispatched before; `entry_id` is the original entry.
    appended: bool
    # Replicas asked for (RIG_REDIS_WAIT_REPLICAS) and replicas that acknowledged the entry.
    wanted: int = 0
    acked: int = 0

    @property
    def under_replicated(self) -> bool:
        """Appended, but fewer replicas than asked hold it: a failover now could lose it."""
        return self.acked < self.wanted


async def dispatch(rt: Runtime, issue: Assignment) -> Dispatched:
    """Append the issue's entry unless its key was dispatched already, and record the
    dispatch."""
    stream = StreamKey(rt.settings.dispatch_stream)
    key = issue.key
    fields = {
        "type": EventKind.ISSUE_ASSIGNED,
        "issueId": issue.issue_id,
        "agentId": issue.agent_id,
        "payload": json.dumps(issue.payload, separators=(",", ":")),
        "assignedAt": datetime.now(UTC).isoformat(),
    }
    remember_s = rt.settings.event_retention_days * 86_400
    wanted = rt.settings.redis_wait_replicas
    acked = wanted
    if wanted:
        entry_id, appended, acked = await _append_replicated(rt, stream, key, fields, remember_s)
    else:
        entry_id, appended = await redis_writes.append_once(
            rt.redis, stream=stream, key=key, fields=fields, remember_s=remember_s
        )
    await dispatches.record_dispatch(
        rt.engine,
        tenant=rt.settings.tenant,
        key=key,
        issue_id=issue.issue_id,
        agent_id=issue.agent_id,
        stream=stream,
        entry_id=entry_id,
        fields=fields,
    )
    if appended:
        rt.metrics.dispatched.labels(stream).inc()
        logger.info("Dispatched %s to %s as %s", issue.issue_id, stream, entry_id)
    done = Dispatched(stream, entry_id, appended, wanted, acked)
    if done.under_replicated:
        logger.warning(
            "Dispatch %s appended as %s, but %d of %d replicas acknowledged it within %d ms",
            issue.issue_id,
            entry_id,
            acked,
            wanted,
            WAIT_TIMEOUT_MS,
        )
    return done


async def _append_replicated(
    rt: Runtime, stream: StreamKey, key: str, fields: dict[str, str], remember_s: int
) -> tuple[EntryId, bool, int]:
    """The append and its WAIT on one connection to the stream's server. On a cluster whose
    slot map is stale, the append (idempotent) is tried again on the new owner, once."""
    return await redis_client.on_owner(
        rt.servers(),
        stream,
        lambda client: redis_writes.append_once_replicated(
            client,
            stream=stream,
            key=key,
            fields=fields,
            remember_s=remember_s,
            replicas=rt.settings.redis_wait_replicas,
            timeout_ms=WAIT_TIMEOUT_MS,
        ),
    )
