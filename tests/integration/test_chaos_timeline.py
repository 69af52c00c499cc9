"""The chaos soak's timeline of an issue it found wrong (bench/chaos_timeline.py), read from a
real event log: the issue's rows and the batches that hold one of its entries, oldest first,
beside the agents' log lines about its entries and the faults that concern it; nothing of
another issue or another tenant."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chaos_report import Database
from chaos_timeline import Fault, timeline

T0 = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)
TENANT = "chaos-run1"


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
async def db(database_url: str, engine: AsyncEngine) -> AsyncIterator[Database]:
    """The soak's own connection, on tables `engine` emptied."""
    found = Database(make_url(database_url).set(drivername="postgresql").render_as_string(False))
    try:
        yield found
    finally:
        await found.close()


async def plant(engine: AsyncEngine, *rows: dict[str, Any]) -> None:
    columns = ("tenant", "occurred_at", "kind", "consumer", "entry_id", "entry_ids")
    columns += ("issue_id", "attempt", "fenced", "detail", "group_name")
    async with engine.begin() as conn:
        for row in rows:
            values = {"tenant": TENANT, "consumer": None, "entry_id": None, "entry_ids": None}
            values["group_name"] = None
            values |= {"issue_id": None, "attempt": None, "fenced": False, "detail": {}} | row
            values["detail"] = json.dumps(values["detail"])
            await conn.execute(
                text(
                    f"INSERT INTO events ({', '.join(columns)}) VALUES "
                    f"({', '.join(':' + c for c in columns)})"
                ),
                values,
            )


def log(seconds: float, message: str) -> str:
    return json.dumps({"time": at(seconds).isoformat(), "message": message})


async def test_the_timeline_tells_one_issues_story_in_order(
    engine: AsyncEngine, db: Database
) -> None:
    mine, other = "chaos-run1-00007", "chaos-run1-00008"
    await plant(
        engine,
        {"occurred_at": at(0), "kind": "ISSUE_ASSIGNED", "entry_id": "100-0", "issue_id": mine},
        {"occurred_at": at(0.1), "kind": "ISSUE_ASSIGNED", "entry_id": "101-0", "issue_id": other},
        {
            "occurred_at": at(1),
            "kind": "WORK_COMPLETED",
            "entry_id": "100-0",
            "issue_id": mine,
            "consumer": "chaos-w1-1",
            "attempt": 1,
        },
        {
            "occurred_at": at(3),
            "kind": "RECLAIMED",
            "entry_ids": "{101-0,100-0}",
            "consumer": "chaos-w2-1",
            "detail": {"reason": "down", "toConsumer": "chaos-w3-1"},
        },
        {"occurred_at": at(4), "kind": "RECLAIMED", "entry_ids": "{101-0}"},
        {
            "occurred_at": at(2),
            "kind": "WORK_COMPLETED",
            "entry_id": "100-0",
            "consumer": "chaos-w0-1",
            "attempt": 2,
            "fenced": True,
        },
        # Another run's tenant, the same issue id: not this run's story.
        {"tenant": "chaos-run0", "occurred_at": at(1.5), "kind": "X", "issue_id": mine},
    )
    agent_logs = {
        "chaos-w1-1": "\n".join(
            [
                log(0.5, "Entry 100-0 (issue chaos-run1-00007, attempt 1): staged"),
                log(0.6, "Entry 101-0 (issue chaos-run1-00008, attempt 1): completed"),
                "Traceback (most recent call last): 100-0",  # not a record
            ]
        ),
    }
    faults = [
        Fault(at(-5).timestamp(), "Redis restart 1: before the story began"),
        Fault(at(1.2).timestamp(), "SIGKILLed chaos-w1-1", "chaos-w1-1"),
        Fault(at(1.3).timestamp(), "SIGKILLed chaos-w9-1", "chaos-w9-1"),
        Fault(at(3.5).timestamp(), "SIGKILLed chaos-w3-1", "chaos-w3-1"),  # the move's target
        Fault(at(5).timestamp(), "Redis restart 2: SHUTDOWN NOSAVE"),
    ]

    lines = await timeline(
        db,
        tenant=TENANT,
        issue=mine,
        what="missing effect",
        entry_ids=["100-0", ""],
        logs=agent_logs,
        faults=faults,
    )

    assert lines[0] == f"timeline of {mine} (missing effect), 8 happenings:"
    story = [line.split("s  ", 1)[1].split() for line in lines[1:]]
    assert [" ".join(words) for words in story] == [
        "event ISSUE_ASSIGNED entry 100-0",
        "chaos-w1-1 Entry 100-0 (issue chaos-run1-00007, attempt 1): staged",
        "event WORK_COMPLETED entry 100-0 consumer chaos-w1-1 attempt 1",
        "soak SIGKILLed chaos-w1-1",
        "event WORK_COMPLETED entry 100-0 consumer chaos-w0-1 attempt 2 FENCED",
        "event RECLAIMED batch of 2 entries consumer chaos-w2-1"
        ' {"reason":"down","toConsumer":"chaos-w3-1"}',
        "soak SIGKILLed chaos-w3-1",
        "soak Redis restart 2: SHUTDOWN NOSAVE",
    ]
    assert lines[1].startswith("    12:00:00.000 +  0.000s")
    assert all(line.startswith("    ") for line in lines[1:])


async def test_an_issue_without_a_row_says_so(engine: AsyncEngine, db: Database) -> None:
    lines = await timeline(
        db, tenant=TENANT, issue="nowhere", what="lost", entry_ids=[], logs={}, faults=[]
    )
    assert lines == [
        "timeline of nowhere (lost), 0 happenings:",
        "    (nothing in the event log, the agents' logs or the faults)",
    ]


async def test_the_typescript_agents_lines_and_each_rows_group_are_in_the_story(
    engine: AsyncEngine, db: Database
) -> None:
    """A mixed fleet: the TypeScript runtime logs text lines, not JSON; with several groups
    each row says which group it was in."""
    mine = "chaos-run1-00009"
    await plant(
        engine,
        {"occurred_at": at(0), "kind": "ISSUE_ASSIGNED", "entry_id": "200-0", "issue_id": mine},
        {
            "occurred_at": at(1),
            "kind": "WORK_STARTED",
            "entry_id": "200-0",
            "issue_id": mine,
            "consumer": "chaos2-w1-1",
            "group_name": "chaos2",
            "attempt": 1,
        },
    )
    stamp = at(1.5).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    agent_logs = {
        "chaos2-w1-1": "\n".join(
            [
                f"{stamp} WARNING rig-agent: Abandoned entry 200-0 (attempt 1): no progress",
                "file:///x.mjs:1 throw new Error('200-0')",  # a crash's last words
            ]
        ),
    }

    lines = await timeline(
        db,
        tenant=TENANT,
        issue=mine,
        what="lost in group chaos2",
        entry_ids=["200-0"],
        logs=agent_logs,
        faults=[],
    )

    story = [" ".join(line.split("s  ", 1)[1].split()) for line in lines[1:]]
    assert story == [
        "event ISSUE_ASSIGNED entry 200-0",
        "event WORK_STARTED entry 200-0 consumer chaos2-w1-1 group chaos2 attempt 1",
        "chaos2-w1-1 Abandoned entry 200-0 (attempt 1): no progress",
    ]
