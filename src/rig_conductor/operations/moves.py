"""Moving pending entries by hand: the safe form of the manual XCLAIM.

The form names entry ids only; everything else comes from Redis at the time of the move. Each
selected id is looked up for the owner (`XPENDING <stream> <group> <id> <id> 1 <owner>`,
pipelined): an id the owner does not hold (acked, moved, or never its own) is left out. The
entries the owner holds are judged as the reaper judges them, by an owner rule with reason
`manual` (`reclaim.plan_by_hand`): one whose deliveries, or recorded attempts, reached
RIG_MAX_DELIVERIES is dead-lettered exactly as in reaper step 7; the others move with their own
guarded `XCLAIM ... JUSTID` whose min-idle is the idle time Redis reported just before (never a
client's number), so an entry touched in between stays where it is. The reaper's applier
(`effects.applier`), handed out by the request's write port (`effects.port`), carries the
plan out: a move reserves a new attempt for the target (the old owner's late reports are
fenced), logs the reaper's own `[StreamReclaim] Reclaimed` line with
reason `manual`, writes a RECLAIMED event row naming who moved it, and records the move to the
target (whose idle time it resets: no evidence of life, reaper rule 5, docs/rules.md).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rig_conductor import logs, roles
from rig_conductor.adapters import failures
from rig_conductor.adapters.postgres import work
from rig_conductor.adapters.redis import holders as redis_holders
from rig_conductor.adapters.redis import inspection as redis_inspect
from rig_conductor.adapters.redis import reading as redis_reading
from rig_conductor.domain import ConsumerName, GroupName, PendingEntry, StreamKey
from rig_conductor.effects import port
from rig_conductor.operations import evidence as built
from rig_conductor.policy import reclaim
from rig_conductor.policy.liveness import Fleet, TargetCandidate
from rig_conductor.runtime import Runtime

audit_log = logging.getLogger(logs.CONSOLE_LOGGER)

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
    effects: port.Effects | None = None,
) -> Moved:
    """Move the entries `ids` of `owner` to `target`, as far as Redis says they may, through
    `effects` (the request's write port; one of its own without)."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise MoveRefused("no entries selected")
    if len(ids) > MAX_ENTRIES:
        raise MoveRefused(f"at most {MAX_ENTRIES} entries per move")
    if target == owner:
        raise MoveRefused("the target is the owner itself")
    effects = effects or port.choose(
        False, engine=rt.engine, tenant=rt.settings.tenant, metrics=rt.metrics
    )
    fleet, to = await _check_target(rt, stream=stream, group=group, target=target)
    with failures.named_by_request():
        held = await redis_inspect.held_by(
            rt.redis,
            stream=stream,
            group=GroupName(group),
            consumer=ConsumerName(owner),
            ids=ids,
        )
    plan = await _plan(rt, fleet, to, stream=stream, group=group, owner=owner, held=held)
    applied = await effects.apply(plan, redis=rt.redis, by=caller.who)  # type: ignore[arg-type]
    result = Moved(
        len(ids),
        moved=[str(entry_id) for entry_id in applied.moved],
        dead_lettered=[str(entry_id) for entry_id in applied.dead_lettered],
        not_held=[i for i in ids if i not in held],
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


@dataclass(slots=True)
class MovedMany:
    """What became of the entries an API move named, whoever held them."""

    moved: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (entry id, why)


async def move_to(
    rt: Runtime,
    caller: roles.Caller,
    *,
    stream: StreamKey,
    group: str,
    target: str,
    ids: Sequence[str],
) -> MovedMany:
    """Move `ids` of `group`, whoever holds each, to `target` (`POST /api/moves`): the target
    is judged first (`MoveRefused`, nothing moves), then each holder's entries go through
    `move`, the console's guarded move."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        raise MoveRefused("no entries selected")
    if len(ids) > MAX_ENTRIES:
        raise MoveRefused(f"at most {MAX_ENTRIES} entries per move")
    await _check_target(rt, stream=stream, group=group, target=target)
    with failures.named_by_request():
        holders = await redis_holders.held_in_group_many(
            rt.redis, stream=stream, group=group, entry_ids=ids
        )
    effects = port.choose(False, engine=rt.engine, tenant=rt.settings.tenant, metrics=rt.metrics)
    done = MovedMany()
    by_owner: dict[str, list[str]] = {}
    for entry_id in ids:
        holder = holders.get(entry_id)
        if holder is None:
            done.skipped.append((entry_id, "not pending in the group"))
        elif holder == target:
            done.skipped.append((entry_id, "already held by the target"))
        else:
            by_owner.setdefault(holder, []).append(entry_id)
    for owner, owned in by_owner.items():
        result = await move(
            rt,
            caller,
            stream=stream,
            group=group,
            owner=owner,
            target=target,
            ids=owned,
            effects=effects,
        )
        done.moved.extend(result.moved)
        why = dict.fromkeys(result.dead_lettered, "dead-lettered: RIG_MAX_DELIVERIES reached")
        why.update(dict.fromkeys(result.not_held, f"no longer held by {owner}"))
        for entry_id in owned:
            if entry_id not in result.moved:
                done.skipped.append((entry_id, why.get(entry_id, "touched since it was read")))
    return done


async def _plan(
    rt: Runtime,
    fleet: Fleet,
    to: TargetCandidate,
    *,
    stream: StreamKey,
    group: str,
    owner: str,
    held: Mapping[str, PendingEntry],
) -> reclaim.ReclaimPlan:
    """The owner's rule (reason `manual`, its recorded attempts counting towards
    RIG_MAX_DELIVERIES) applied to the entries it holds: what moves to `to`, what is worn."""
    evidence = await work.load_work_evidence(
        rt.engine,
        tenant=rt.settings.tenant,
        streams=[stream],
        worn_at=rt.settings.max_deliveries,
        deadline_ms=0,
    )
    worn, _, finished = evidence.of(stream, GroupName(group))
    rule = reclaim.OwnerRule(
        owner=ConsumerName(owner),
        agent=fleet.agent_of(ConsumerName(owner)),
        reason=REASON,
        min_idle_ms=0,
        max_deliveries=rt.settings.max_deliveries,
        worn=worn,
        finished=finished,
    )
    assessment = reclaim.GroupAssessment(stream, GroupName(group), {rule.owner: rule}, (to,))
    return reclaim.plan_by_hand(assessment, list(held.values()), target=to.consumer)


async def _check_target(
    rt: Runtime, *, stream: StreamKey, group: str, target: str
) -> tuple[Fleet, TargetCandidate]:
    """The fleet as the evidence shows it now, and `target` as rule 5 ranks it: a consumer of
    the group that may receive entries, else `MoveRefused`."""
    with failures.named_by_request():
        reading = await redis_reading.read(rt.servers(), [stream], only=group)
    found = next((g for g in reading.groups if g.name == group and g.stream == stream), None)
    if found is None:
        raise MoveRefused(f"no group {group!r} on stream {stream!r}")
    info = next((c for c in found.consumers if c.name == target), None)
    if info is None:
        raise MoveRefused(f"{target!r} is not a consumer of {stream}/{group}")
    names = [c.name for c in found.consumers]  # the group's own: not every heartbeat row
    known = await built.for_move(rt.engine, rt.settings, rt.pods, consumers=names)
    fleet = Fleet(known, rt.settings.limits)
    candidate = fleet.target(info, stream=stream, group=found.name)
    if candidate is None:
        raise MoveRefused(f"{target!r} is not live: it may not receive entries")
    return fleet, candidate
