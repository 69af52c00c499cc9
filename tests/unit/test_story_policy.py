"""The story of a piece of work, decided from facts alone: a group's state, the summary, and
how event-log rows read on the timeline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from rig_conductor.policy import story
from rig_conductor.policy.story import Assignment, GroupLook, State

AT = datetime(2026, 11, 29, 1, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Row:
    kind: str
    consumer: str | None = None
    agent_id: str | None = None
    stream: str | None = "rig:dispatch"
    group_name: str | None = None
    entry_id: str | None = "1-0"
    attempt: int | None = None
    fenced: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)
    count: int = 1
    occurred_at: datetime = AT
    until: datetime = AT


RUNNING = Assignment("running", "w-0", 2)
FAILED = Assignment("failed", "w-0", 1)
DONE = Assignment("done", "w-1", 3)


@pytest.mark.parametrize(
    ("look", "assignment", "dead", "want", "attempt"),
    [
        (GroupLook("g", True, "w-0"), RUNNING, False, State.RUNNING, 2),
        (GroupLook("g", True, "w-0"), FAILED, False, State.FAILED, 1),
        # Held by another consumer than the attempt's owner: moved, not started yet.
        (GroupLook("g", True, "w-9"), RUNNING, False, State.PENDING, None),
        (GroupLook("g", True, "w-0"), None, False, State.PENDING, None),
        (GroupLook("g", False, None), None, False, State.UNREAD, None),
        (GroupLook("g", True, None), DONE, False, State.DONE, 3),
        (GroupLook("g", True, None), None, False, State.DONE, None),
        (GroupLook("g", True, None), Assignment("dead", "w-0", 5), True, State.DEAD_LETTERED, 5),
    ],
)
def test_a_groups_state(
    look: GroupLook, assignment: Assignment | None, dead: bool, want: State, attempt: int | None
) -> None:
    told = story.group_state(look, assignment, dead_lettered=dead)
    assert (told.state, told.attempt, told.holder) == (want, attempt, look.holder)


@pytest.mark.parametrize(
    ("states", "assignment", "want"),
    [
        ([State.DONE, State.UNREAD], None, State.UNREAD),
        ([State.DONE, State.RUNNING, State.PENDING], None, State.RUNNING),
        ([State.DONE, State.DEAD_LETTERED], None, State.DEAD_LETTERED),
        ([State.DONE], None, State.DONE),
        ([], None, State.UNREAD),
        ([], DONE, State.DONE),
        ([], Assignment("dead", None, 1), State.DEAD_LETTERED),
    ],
)
def test_the_summary_is_the_least_finished_group(
    states: list[State], assignment: Assignment | None, want: State
) -> None:
    groups = [story.GroupStory(f"g{n}", s, None, None) for n, s in enumerate(states)]
    assert story.summary(groups, assignment) == want


def test_items_say_only_what_applies() -> None:
    assert story.item(Row("ISSUE_ASSIGNED", agent_id="dev-e")) == {
        "at": AT,
        "kind": "DISPATCHED",
        "entryId": "1-0",
        "agentId": "dev-e",
    }
    moved = story.item(
        Row(
            "RECLAIMED",
            consumer="w-0",
            group_name="g",
            detail={"toConsumer": "w-1", "reason": "stalled", "by": None},
        )
    )
    assert (moved["from"], moved["to"], moved["reason"], moved["group"]) == (
        "w-0",
        "w-1",
        "stalled",
        "g",
    )
    assert "consumer" not in moved and "by" not in moved
    old = story.item(Row("RECLAIMED", consumer="w-0", detail={"toConsumer": "w-1"}))
    assert old["reason"] == "down"  # rows from before reasons were recorded


def test_fenced_reports_and_folded_progress() -> None:
    fenced = story.item(Row("WORK_COMPLETED", consumer="w-0", attempt=1, fenced=True))
    assert fenced["kind"] == "FENCED" and "WORK_COMPLETED" in fenced["reason"]
    folded = story.item(Row("WORK_PROGRESS", consumer="w-0", attempt=2, count=10_000))
    assert (folded["kind"], folded["count"], folded["until"]) == ("PROGRESS", 10_000, AT)
    single = story.item(Row("WORK_PROGRESS", consumer="w-0", attempt=2))
    assert "count" not in single
    failed = story.item(Row("WORK_FAILED", attempt=1, detail={"error": "boom"}))
    assert (failed["kind"], failed["reason"]) == ("FAILED", "boom")
    asked = story.item(
        Row("DEAD_LETTERED", detail={"reason": "max-deliveries", "askedBy": "w-0", "dlqId": "9-0"})
    )
    assert (asked["askedBy"], asked["dlqId"], asked["reason"]) == ("w-0", "9-0", "max-deliveries")
    again = story.item(Row("ISSUE_ASSIGNED", detail={"replaces": "0-1"}))
    assert again["replaces"] == "0-1"
