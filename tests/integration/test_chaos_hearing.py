"""The chaos soak's story of a live agent reclaimed as down (bench/chaos_hearing.py), read from a
real database: the consumer's and its agent's heard intervals, the replicas' listening marks,
the agent's lines about its heartbeats, the conductors' lines about their lives and the faults,
oldest first, over the time before the reclaim; nothing of another consumer or tenant."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from chaos_hearing import hearing
from chaos_report import Database, Reclaim, first_heard, live_reclaims
from chaos_timeline import Fault

from .test_chaos_timeline import TENANT, db  # noqa: F401 - the soak's own connection

T0 = datetime(2026, 11, 28, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def log(seconds: float, message: str) -> str:
    return json.dumps({"time": at(seconds).isoformat(), "message": message})


async def test_the_story_shows_what_was_heard_before_the_reclaim(
    engine: AsyncEngine,
    db: Database,  # noqa: F811
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO liveness (tenant, agent_id, consumer, heard_from, heard_to, "
                "degraded, beats) VALUES (:t, 'chaos-w2', :c, :f, :to, false, :n)"
            ),
            [
                {"t": TENANT, "c": "chaos-w2-5", "f": at(-60), "to": at(-40), "n": 20},  # too old
                {"t": TENANT, "c": "chaos-w2-5", "f": at(-10), "to": at(-2), "n": 8},
                {"t": TENANT, "c": "chaos-w1-5", "f": at(-10), "to": at(-1), "n": 9},
                {"t": "chaos-other", "c": "chaos-w2-5", "f": at(-9), "to": at(-1), "n": 8},
            ],
        )
        await conn.execute(
            text(
                "INSERT INTO consumer_heartbeats (tenant, consumer, agent_id, last_heartbeat_at,"
                " heard_since, beats) VALUES (:t, 'chaos-w2-5', 'chaos-w2', :last, :since, 3)"
            ),
            {"t": TENANT, "last": at(3), "since": at(1)},
        )
        await conn.execute(
            text(
                "INSERT INTO listening (tenant, replica, heard_from, heard_to) "
                "VALUES (:t, :r, :f, :to)"
            ),
            [
                {"t": TENANT, "r": "vm_1", "f": at(-30), "to": at(-1.5)},
                {"t": TENANT, "r": "vm_2", "f": at(0.5), "to": at(4)},
                {"t": "chaos-other", "r": "vm_9", "f": at(-1), "to": at(0.4)},
            ],
        )
    agent_log = "\n".join(
        [
            log(-3, "Entry 100-0 (issue chaos-run1-00007, attempt 1): completed"),
            log(-1, "Heartbeat failed: no answer within 1.0s"),
        ]
    )
    conductors = {
        "conductor-2": "\n".join(
            [
                log(-1.6, "Shutting down"),
                log(-1.4, "Dispatched chaos-run1-00009 to chaos as 1-0"),
            ]
        ),
        "conductor-3": log(0.6, "Blind spell over: no conductor could take heartbeats in"),
    }
    faults = [Fault(at(-1.7).timestamp(), "conductor outage 1: every conductor stopped")]

    lines = await hearing(
        db,
        tenant=TENANT,
        consumer="chaos-w2-5",
        agent="chaos-w2",
        reclaimed_at=at(1).timestamp(),
        log=agent_log,
        conductors=conductors,
        faults=faults,
    )

    assert lines[0] == (
        "timeline of hearing of chaos-w2-5 (live agent reclaimed as down at 12:00:01.000), "
        "10 happenings:"
    )
    story = [" ".join(line.split("s  ", 1)[1].split()) for line in lines[1:]]
    assert story == [
        "listening vm_1 marks listening from 11:59:30.000 to 11:59:58.500",
        "heard consumer chaos-w2-5 heard, interval from 11:59:50.000 to 11:59:58.000, 8 beats",
        "soak conductor outage 1: every conductor stopped",
        "conductor-2 Shutting down",
        "listening vm_1 last mark (from 11:59:30.000 to 11:59:58.500)",
        "chaos-w2-5 Heartbeat failed: no answer within 1.0s",
        "listening vm_2 marks listening from 12:00:00.500 to 12:00:04.000",
        "conductor-3 Blind spell over: no conductor could take heartbeats in",
        "heard consumer chaos-w2-5 heard, open interval from 12:00:01.000 to 12:00:03.000, 3 beats",
        "listening vm_2 last mark (from 12:00:00.500 to 12:00:04.000)",
    ]


async def test_a_live_agent_is_one_the_conductor_heard_and_that_still_runs(
    engine: AsyncEngine,
    db: Database,  # noqa: F811
) -> None:
    """A `down` reclaim counts against the run when its owner's process had been heard (its first
    heartbeat received, closed interval or open) and had not ended; a process still starting is
    no live agent yet; a consumer of no process the soak started always counts."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO liveness (tenant, agent_id, consumer, heard_from, heard_to, "
                "degraded, beats) VALUES (:t, 'chaos-w0', :c, :f, :to, false, 3)"
            ),
            [
                {"t": TENANT, "c": "chaos-w0-1", "f": at(2), "to": at(4)},
                {"t": TENANT, "c": "chaos-w0-1", "f": at(6), "to": at(8)},
                {"t": "chaos-other", "c": "chaos-w0-2", "f": at(0), "to": at(1)},
            ],
        )
        await conn.execute(
            text(
                "INSERT INTO consumer_heartbeats (tenant, consumer, agent_id, last_heartbeat_at,"
                " heard_since, beats) VALUES (:t, 'chaos-w0-2', 'chaos-w0', :last, :since, 2)"
            ),
            {"t": TENANT, "last": at(12), "since": at(11)},
        )
    heard = await first_heard(db, TENANT)
    assert heard == {"chaos-w0-1": at(2).timestamp(), "chaos-w0-2": at(11).timestamp()}

    lifetimes = {
        "chaos-w0-1": (at(0).timestamp(), at(20).timestamp()),  # heard from 2 s
        "chaos-w0-2": (at(9).timestamp(), None),  # started at 9 s, first heard at 11 s
        "chaos-w0-3": (at(9).timestamp(), None),  # never heard
    }

    def down(seconds: float, source: str, reason: str = "down") -> Reclaim:
        return Reclaim(at(seconds).timestamp(), f"{seconds:g}-0", source, "chaos-w1-1", reason)

    reclaims = [
        down(1, "chaos-w0-1"),  # not heard yet
        down(3, "chaos-w0-1"),  # heard, running: live
        down(5, "chaos-w0-1", "stalled"),  # not a `down` verdict
        down(21, "chaos-w0-1"),  # ended
        down(10, "chaos-w0-2"),  # started, still starting
        down(11, "chaos-w0-2"),  # heard at that very moment: live
        down(30, "chaos-w0-3"),
        down(30, "chaos-x9-1"),  # no process the soak started
    ]
    live = live_reclaims(reclaims, lifetimes, heard)
    assert [(r.source, r.entry_id) for r in live] == [
        ("chaos-w0-1", "3-0"),
        ("chaos-w0-2", "11-0"),
        ("chaos-x9-1", "30-0"),
    ]
