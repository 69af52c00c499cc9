"""Moving pending entries by hand: the safe form of the manual XCLAIM.

Each entry moves with its own guarded `XCLAIM ... JUSTID`, its min-idle the idle time the
operator saw plus the time since, both on Redis's clock (the page notes Redis's TIME after it
read the entries): an entry acked, re-read or moved by the reaper since the page was drawn is
not idle enough and stays where it is. A move reserves a
new attempt for the target (the old owner's late reports are fenced), logs the reaper's own
`[StreamReclaim] Reclaimed` line with reason `manual`, and writes a RECLAIMED event row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from rig_conductor import logs, roles
from rig_conductor.adapters import redis_inspect, redis_reading, redis_sweep
from rig_conductor.adapters.postgres import queries, work
from rig_conductor.domain import ConsumerName, EntryId, GroupName, StreamKey
from rig_conductor.metrics import UNKNOWN_AGENT
from rig_conductor.operations import views
from rig_conductor.policy.liveness import Fleet
from rig_conductor.runtime import Runtime

# The reaper's logger: operators filter the [StreamReclaim] lines on it.
reclaim_log = logging.getLogger("rig_conductor.reaper.cycle")
audit_log = logging.getLogger("rig_conductor.console")

REASON = "manual"
MAX_ENTRIES = 1_000


@dataclass(frozen=True, slots=True)
class Seen:
    """A pending entry as the operator's page showed it."""

    id: str
    idle_ms: int


class MoveRefused(ValueError):
    """The move is not allowed as asked: the message says why."""


async def move(
    rt: Runtime,
    caller: roles.Caller,
    *,
    stream: str,
    group: str,
    owner: str,
    target: str,
    entries: Sequence[Seen],
    seen_at_ms: int,
) -> list[str]:
    """Move `entries` of `owner` to `target`; the ids that moved. `seen_at_ms`: Redis's TIME
    when the page showed the entries (`redis_inspect.server_time_ms`)."""
    if not entries:
        raise MoveRefused("no entries selected")
    if len(entries) > MAX_ENTRIES:
        raise MoveRefused(f"at most {MAX_ENTRIES} entries per move")
    if target == owner:
        raise MoveRefused("the target is the owner itself")
    await _check_target(rt, stream=stream, group=group, target=target)
    elapsed = max(0, await redis_inspect.server_time_ms(rt.redis) - seen_at_ms)
    batches = [
        redis_sweep.ClaimBatch(ConsumerName(target), e.idle_ms + elapsed, [EntryId(e.id)])
        for e in entries
    ]
    claimed = await redis_sweep.claim(
        rt.redis,  # type: ignore[arg-type]
        stream=StreamKey(stream),
        group=GroupName(group),
        batches=batches,
    )
    moved: list[str] = [str(entry_id) for ids in claimed for entry_id in ids]
    if moved:
        await _record(rt, caller, stream=stream, group=group, owner=owner, target=target, ids=moved)
    audit_log.info(
        "[Console] %s moved %d of %d selected entries on %s/%s: %s -> %s",
        caller.who,
        len(moved),
        len(entries),
        stream,
        group,
        owner,
        target,
    )
    return moved


async def _check_target(rt: Runtime, *, stream: str, group: str, target: str) -> None:
    reading = await redis_reading.read(rt.servers(), [stream])
    found = next((g for g in reading.groups if g.name == group and g.stream == stream), None)
    if found is None:
        raise MoveRefused(f"no group {group!r} on stream {stream!r}")
    info = next((c for c in found.consumers if c.name == target), None)
    if info is None:
        raise MoveRefused(f"{target!r} is not a consumer of {stream}/{group}")
    fleet = Fleet(await views.evidence(rt), rt.settings.limits)
    if fleet.target(info) is None:
        raise MoveRefused(f"{target!r} is not live: it may not receive entries")


async def _record(
    rt: Runtime,
    caller: roles.Caller,
    *,
    stream: str,
    group: str,
    owner: str,
    target: str,
    ids: list[str],
) -> None:
    await work.reclaimed(
        rt.engine, tenant=rt.settings.tenant, stream=stream, consumer=target, entry_ids=ids
    )
    fleet = Fleet(await views.evidence(rt), rt.settings.limits)
    from_agent = fleet.agent_of(ConsumerName(owner))
    to_agent = fleet.agent_of(ConsumerName(target))
    detail = {
        "toConsumer": target,
        "toAgent": to_agent,
        "reason": REASON,
        "by": caller.who,
        "count": len(ids),
    }
    await queries.append_events(
        rt.engine,
        tenant=rt.settings.tenant,
        rows=[
            queries.EventRow(
                "RECLAIMED",
                agent_id=from_agent,
                consumer=owner,
                stream=stream,
                group_name=group,
                detail=json.dumps(detail),
                entry_ids="{" + ",".join(ids) + "}",
            )
        ],
    )
    rt.metrics.reclaimed.labels(
        stream, group, from_agent or UNKNOWN_AGENT, to_agent or UNKNOWN_AGENT, REASON
    ).inc(len(ids))
    common = {
        "stream": stream,
        "group": group,
        "fromConsumer": owner,
        "toConsumer": target,
        "fromAgent": from_agent,
        "toAgent": to_agent,
        "reason": REASON,
        "by": caller.who,
    }
    tail = f" on {stream}: {owner} -> {target}"
    sentences = [f"[StreamReclaim] Reclaimed {entry_id}{tail}" for entry_id in ids]
    logs.log_lines(reclaim_log, logging.INFO, logs.Lines(sentences, common, ("entryId", ids)))
