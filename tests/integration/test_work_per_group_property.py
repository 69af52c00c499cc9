"""Property: whatever WORK_* events any number of groups send about one entry, in any order, no
group's events change another group's attempts or done state. Each group's answers with the
others' events interleaved are exactly its answers alone. Real PostgreSQL, `record_work` as the
API applies it."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from typing import Literal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import work

S = "rig:dispatch"
GROUPS = ("workers", "auditors", "rogue")
Kind = Literal["WORK_STARTED", "WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED"]
KINDS: tuple[Kind, ...] = ("WORK_STARTED", "WORK_PROGRESS", "WORK_COMPLETED", "WORK_FAILED")
# (group, consumer, kind, which attempt it names relative to the last one it was given)
Event = tuple[str, str, Kind, int]

events = st.lists(
    st.tuples(
        st.sampled_from(GROUPS),
        st.sampled_from(("c-0", "c-1")),
        st.sampled_from(KINDS),
        st.sampled_from((-1, 0, 1)),
    ),
    min_size=1,
    max_size=14,
)
_ids = itertools.count(1)


async def answers(
    engine: AsyncEngine, sent: Sequence[Event]
) -> dict[str, list[tuple[object, ...]]]:
    """Apply `sent` to a fresh entry; each group's answers, in order."""
    entry = f"{next(_ids)}-{uuid.uuid4().int % 1000}"
    given_attempt: dict[tuple[str, str], int] = {}
    out: dict[str, list[tuple[object, ...]]] = {group: [] for group in GROUPS}
    for group, consumer, kind, offset in sent:
        name = f"{group}-{consumer}"  # consumers of different groups are different
        last = given_attempt.get((group, name), 1)
        attempt = None if kind == "WORK_STARTED" else max(1, last + offset)
        outcome = await work.record_work(
            engine,
            tenant="default",
            report=work.WorkReport(
                kind=kind,
                agent_id="dev-e",
                stream=S,
                entry_id=entry,
                consumer=name,
                attempt=attempt,
                group=group,
            ),
        )
        if kind == "WORK_STARTED" and outcome.accepted:
            given_attempt[(group, name)] = outcome.attempt
        out[group].append(
            (kind, outcome.accepted, outcome.attempt, outcome.state, outcome.refusal is None)
        )
    return out


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(sent=events)
async def test_no_group_changes_another_groups_work(engine: AsyncEngine, sent: list[Event]) -> None:
    together = await answers(engine, sent)
    for group in GROUPS:
        alone = await answers(engine, [event for event in sent if event[0] == group])
        assert together[group] == alone[group], group
