"""Moving pending entries by hand: the safe form of the manual XCLAIM.

The form names entry ids only; everything else comes from Redis at the time of the move. Each
selected id is looked up for the owner (`XPENDING <stream> <group> <id> <id> 1 <owner>`,
pipelined): an id the owner does not hold (acked, moved, or never its own) is left out. Each
entry the owner holds is judged as the reaper judges it (`reclaim.OwnerRule.partition`): one whose
deliveries, or recorded attempts, reached RIG_MAX_DELIVERIES is dead-lettered exactly as in
reaper step 7; the others move with their own guarded `XCLAIM ... JUSTID` whose min-idle is the
idle time Redis reported just before (never a client's number), so an entry touched in between
stays where it is. A move reserves a new attempt for the target (the old owner's late reports
are fenced), logs the reaper's own `[StreamReclaim] Reclaimed` line with reason `manual`, and
writes a RECLAIMED event row.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from rig_conductor import logs, roles
from rig_conductor.adapters import (
    failures,
    redis_inspect,
    redis_reading,
    redis_streams,
    redis_sweep,
)
from rig_conductor.adapters.postgres import move_targets, queries, work
from rig_conductor.domain import (
    DEAD_LETTER_REASON,
    ConsumerName,
    GroupName,
    PendingEntry,
    StreamKey,
)
from rig_conductor.metrics import UNKNOWN_AGENT
from rig_conductor.operations import views
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet
from rig_conductor.runtime import Runtime

# The reaper's logger: operators filter the [StreamReclaim] lines on it.
reclaim_log = logging.getLogger("rig_conductor.reaper.cycle")
audit_log = logging.getLogger("rig_conductor.console")

REASON: reclaim.Reason = "manual"
MAX_ENTRIES = 1_000


class MoveRefused(ValueError):
    """The move is not allowed as asked: the message says why."""


@dataclass(slots=True)
class Moved:
    """What became of the selected entries."""

    selected: int
    moved: list[str] = field(default_factory=list)
    # Reached RIG_MAX_DELIVERIES: dead-lettered, as the reaper does.
    dead_lettered: list[str] = field(default_factory=list)
    # Not held by the owner when the move looked (acked, moved, or never its own).
    not_held: list[str] = field(default_factory=list)

    @property
    def left(self) -> int:
        """Held and movable, but touched between the look and the move (the guard kept them)."""
        return self.selected - len(self.moved) - len(self.dead_lettered) - len(self.not_held)


async def move(
    rt: Runtime,
    caller: roles.Caller,
    *,
    stream: StreamKey,
    group: str,
    owner: str,
    target: str,
    ids: Sequence[str],
) -> Moved:
    """Move the entries `ids` of `owner` to `target`, as far as Redis says they may."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise MoveRefused("no entries selected")
    if len(ids) > MAX_ENTRIES:
        raise MoveRefused(f"at most {MAX_ENTRIES} entries per move")
    if target == owner:
        raise MoveRefused("the target is the owner itself")
    fleet = await _check_target(rt, stream=stream, group=group, target=target)
    with failures.named_by_request():
        held = await redis_inspect.held_by(
            rt.redis,
            stream=stream,
            group=GroupName(group),
            consumer=ConsumerName(owner),
            ids=ids,
        )
    evidence = await work.load_work_evidence(
        rt.engine,
        tenant=rt.settings.tenant,
        streams=[stream],
        worn_at=rt.settings.max_deliveries,
        deadline_ms=0,
    )
    rule = reclaim.OwnerRule(
        owner=ConsumerName(owner),
        agent=fleet.agent_of(ConsumerName(owner)),
        reason=REASON,
        min_idle_ms=0,
        max_deliveries=rt.settings.max_deliveries,
        worn=evidence.worn.get(stream, {}),
    )
    result = Moved(len(ids), not_held=[i for i in ids if i not in held])
    # Worn entries come with the count that decided it: Redis's deliveries or recorded attempts.
    movable, worn = rule.partition(held.values())
    if worn:
        result.dead_lettered = await _dead_letter(rt, fleet, stream=stream, group=group, worn=worn)
    if movable:
        batches = [
            redis_sweep.ClaimBatch(ConsumerName(target), entry.idle_ms, [entry.id])
            for entry in movable
        ]
        claimed = await redis_sweep.claim(
            rt.redis,  # type: ignore[arg-type]
            stream=stream,
            group=GroupName(group),
            batches=batches,
        )
        result.moved = [str(entry_id) for ids_moved in claimed for entry_id in ids_moved]
    if result.moved:
        await _record(
            rt,
            caller,
            fleet,
            stream=stream,
            group=group,
            owner=owner,
            target=target,
            ids=result.moved,
        )
    audit_log.info(
        "[Console] %s moved %d of %d selected entries on %s/%s: %s -> %s "
        "(%d dead-lettered after RIG_MAX_DELIVERIES, %d not held by %s)",
        caller.who,
        len(result.moved),
        len(ids),
        stream,
        group,
        owner,
        target,
        len(result.dead_lettered),
        len(result.not_held),
        owner,
    )
    return result


async def _check_target(rt: Runtime, *, stream: StreamKey, group: str, target: str) -> Fleet:
    with failures.named_by_request():
        reading = await redis_reading.read(rt.servers(), [stream])
    found = next((g for g in reading.groups if g.name == group and g.stream == stream), None)
    if found is None:
        raise MoveRefused(f"no group {group!r} on stream {stream!r}")
    info = next((c for c in found.consumers if c.name == target), None)
    if info is None:
        raise MoveRefused(f"{target!r} is not a consumer of {stream}/{group}")
    fleet = Fleet(await views.evidence(rt), rt.settings.limits)
    if fleet.target(info, stream=stream, group=found.name) is None:
        raise MoveRefused(f"{target!r} is not live: it may not receive entries")
    return fleet


async def _dead_letter(
    rt: Runtime, fleet: Fleet, *, stream: StreamKey, group: str, worn: list[PendingEntry]
) -> list[str]:
    """Reaper step 7 for worn-out entries: copied to the DLQ with their diagnostics and acked
    (guarded like a move), a DEAD_LETTERED row and a `[StreamReclaim] Dead-lettered` line
    each, the assignment marked dead, the counter raised."""
    done = await redis_streams.dead_letter(
        rt.redis, stream=stream, group=GroupName(group), entries=worn, reason=DEAD_LETTER_REASON
    )
    dlq_stream = redis_streams.dlq_key(stream, rt.redis)
    owners = {entry.id: entry.consumer for entry in worn}
    rows = []
    for item in done:
        consumer = owners[item.entry_id]
        detail = {
            "deliveries": item.deliveries,
            "reason": DEAD_LETTER_REASON,
            "dlqStream": dlq_stream,
            "dlqId": item.dlq_id,
        }
        rows.append(
            queries.EventRow(
                "DEAD_LETTERED",
                agent_id=fleet.agent_of(consumer),
                consumer=consumer,
                stream=stream,
                group_name=group,
                entry_id=item.entry_id,
                issue_id=item.issue_id,
                detail=json.dumps(detail),
            )
        )
        reclaim_log.info(
            "[StreamReclaim] Dead-lettered %s on %s after %d deliveries",
            item.entry_id,
            stream,
            item.deliveries,
            extra={
                "entryId": item.entry_id,
                "stream": stream,
                "group": group,
                "consumer": consumer,
                "deliveries": item.deliveries,
                "dlqId": item.dlq_id,
            },
        )
    await queries.append_events(rt.engine, tenant=rt.settings.tenant, rows=rows)
    await work.dead_lettered(
        rt.engine,
        tenant=rt.settings.tenant,
        stream=stream,
        entries=[(d.entry_id, d.issue_id, d.deliveries) for d in done],
    )
    if done:
        rt.metrics.dead_lettered.labels(stream, group).inc(len(done))
    return [str(d.entry_id) for d in done]


async def _record(
    rt: Runtime,
    caller: roles.Caller,
    fleet: Fleet,
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
    await move_targets.record(
        rt.engine,
        tenant=rt.settings.tenant,
        targets=[(StreamKey(stream), GroupName(group), ConsumerName(target))],
    )
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
    lines = logs.Lines.filled(logs.RECLAIMED, "entryId", ids, common)
    logs.log_lines(reclaim_log, logging.INFO, lines)
