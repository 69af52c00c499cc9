"""The dry write port: every effect logs what it would do, byte for byte the lines a dry run
has always written, and touches neither Redis nor PostgreSQL (its clients here refuse any use)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, NoReturn

import pytest

from rig_conductor.adapters.postgres.dispatches import RecentDispatch
from rig_conductor.adapters.redis.streams import DeadLetter
from rig_conductor.domain import (
    AgentId,
    ConsumerName,
    EntryId,
    GroupName,
    PendingEntry,
    StreamKey,
)
from rig_conductor.effects import port
from rig_conductor.effects import redis_loss as writes
from rig_conductor.metrics import Metrics
from rig_conductor.policy import hygiene, reclaim, registry
from rig_conductor.policy.liveness import TargetCandidate
from tests import reclaim_kit

S, G = StreamKey("rig:dispatch"), GroupName("workers")
OWNER, TARGET = ConsumerName("dead-0"), ConsumerName("live-0")


class Untouchable:
    """A Redis client or an engine that fails the test when anything uses it."""

    def __init__(self, what: str) -> None:
        object.__setattr__(self, "_what", what)

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"a dry run used {self._what}.{name}")


@pytest.fixture
def dry() -> port.Effects:
    effects = port.choose(
        True,
        engine=Untouchable("PostgreSQL"),  # type: ignore[arg-type]
        tenant="default",
        metrics=Metrics(),
        remember_s=86_400,
    )
    assert isinstance(effects, port.DryEffects) and effects.dry
    return effects


REDIS: Any = Untouchable("Redis")
DISPATCH = RecentDispatch("key-1", S, "1-0", "rc-1", "dev-e", {"issueId": "rc-1"})


def said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.name, r.getMessage()) for r in caplog.records]


def test_the_choice_is_made_once_by_the_caller() -> None:
    real = port.choose(False, engine=REDIS, tenant="default")
    assert type(real) is port.Effects and not real.dry


async def test_a_dry_reclaim_moves_nothing_and_says_what_it_would(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    rule = reclaim.OwnerRule(OWNER, AgentId("dead"), "down", 0, 3)
    assessment = reclaim.GroupAssessment(
        S, G, {OWNER: rule}, (TargetCandidate(TARGET, AgentId("live"), False, 0),)
    )
    entries = [
        PendingEntry(EntryId("1-0"), OWNER, 5_000, 3),
        PendingEntry(EntryId("2-0"), OWNER, 5_000, 1),
    ]
    plan = reclaim_kit.plan_reclaims(assessment, entries)
    caplog.set_level(logging.INFO)
    applied = await dry.apply(plan, redis=REDIS)
    assert (applied.moved, applied.dead_lettered) == (["2-0"], ["1-0"])
    assert not applied.outcome.changes  # the scan's counts stay as it read them
    assert said(caplog) == [
        ("rig_conductor.reaper.cycle",
         "[StreamReclaim] DRY RUN: would reclaim 2-0 on rig:dispatch: dead-0 -> live-0 (down)"),
        ("rig_conductor.reaper.cycle",
         "[StreamReclaim] DRY RUN: would dead-letter 1-0 on rig:dispatch after 3 deliveries"),
    ]  # fmt: skip
    assert dry.metrics is not None
    assert (
        dry.metrics.registry.get_sample_value(
            "rig_reclaimed_entries_total",
            {"stream": S, "group": G, "from_agent": "dead", "to_agent": "live", "reason": "down"},
        )
        is None
    )


async def test_a_dry_redispatch_appends_nothing(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert await dry.append_lost(REDIS, DISPATCH) is True  # counted as the report counts it
    assert said(caplog) == [
        ("rig_conductor.reaper.redispatch",
         "DRY RUN: would append dispatch rc-1 again: 1-0 is missing from rig:dispatch"),
    ]  # fmt: skip


async def test_a_dry_recovery_sets_no_marker_and_appends_nothing(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    recovering = dry.recovering()
    assert not recovering.fixes
    caplog.set_level(logging.INFO)
    await recovering.first_sight(REDIS, S)
    assert await recovering.lost(REDIS, S, None) is None
    tally = writes.Tally(present=2)
    await recovering.recover(REDIS, DISPATCH, "append", None, tally, ["workers"])
    await recovering.recovered(S, None, tally)
    assert tally == writes.Tally(appended=1, present=2)
    logger = "rig_conductor.reaper.redis_loss"
    assert said(caplog) == [
        (logger, "DRY RUN: Redis lost its data: the epoch marker beside rig:dispatch is gone "
         "(Redis restarted without persistence, was flushed, or failed over to an empty "
         "replica). Appending every unfinished dispatch again from PostgreSQL"),
        (logger, "DRY RUN: would append dispatch rc-1 again: 1-0 is missing from rig:dispatch"),
        (logger, "DRY RUN: Redis data loss on rig:dispatch: 1 dispatches appended again, 2 there "
         "already, 0 appended by another conductor, 0 finished meanwhile, 0 recorded without "
         "their fields (cannot be appended: dispatch them again)"),
    ]  # fmt: skip


async def test_dry_hygiene_deletes_no_consumer(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    removal = hygiene.ConsumerRemoval(S, G, ConsumerName("gone-0"), AgentId("dev-e"), 90_000)
    caplog.set_level(logging.INFO)
    assert await dry.remove_consumers(REDIS, [removal]) == [removal]
    assert said(caplog) == [
        ("rig_conductor.reaper.cleanup",
         "[ConsumerHygiene] DRY RUN: would delete consumer gone-0 of rig:dispatch/workers: pod "
         "gone, no fresh heartbeat, nothing pending, idle 90000 ms"),
    ]  # fmt: skip


async def test_a_dry_run_forgets_nothing_and_says_nothing_of_it(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    plan = registry.Forget(datetime(2026, 1, 1, tzinfo=UTC), frozenset(), frozenset())
    caplog.set_level(logging.DEBUG)
    await dry.forget(plan, forget_ms=1_000)
    assert said(caplog) == []


async def test_dry_dead_letters_write_nothing(
    dry: port.Effects, caplog: pytest.LogCaptureFixture
) -> None:
    letter = DeadLetter("9-0", "1-0", G, OWNER, 3, "max-deliveries", {"issueId": "rc-1"})
    caplog.set_level(logging.INFO)
    assert await dry.requeue(REDIS, stream=S, dlq_ids=["9-0"], by="operator:1") == {}
    assert await dry.delete(REDIS, stream=S, letters=[letter], by="operator:1") == []
    held = await dry.dead_letter_held(
        REDIS,
        stream=S,
        group=G,
        consumer=OWNER,
        agent_id="dead",
        entry_id=EntryId("1-0"),
        deliveries=3,
        reason="max-deliveries",
    )
    assert held is None
    assert [message for _, message in said(caplog)] == [
        "DRY RUN: would requeue dead letter 9-0 of rig:dispatch (operator:1)",
        "DRY RUN: would delete dead letter 9-0 of rig:dispatch (operator:1)",
        "[StreamReclaim] DRY RUN: would dead-letter 1-0 on rig:dispatch after 3 deliveries",
    ]
