"""Migration 0020 against a real PostgreSQL: a RECLAIMED batch is indexed once, by the span of
its ids' times, and the story of one entry still finds every batch that names it, rows written
before the migration included, through that index."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import migrations, queries, story, writes
from rig_conductor.domain import EventKind
from tests.integration.helpers import database_at, engine_on

BEFORE = "0019"  # the revision before the one under test: 0018's GIN index on `entry_ids`
TENANT, STREAM, OTHER = "default", "rig:dispatch", "rig:other"
TARGET = "1700000010000-6"  # the entry whose story is read


@pytest.fixture
def old_url(database_url: str) -> Iterator[str]:
    with database_at(database_url, "rig_span", BEFORE) as url:
        yield url


@pytest.fixture
async def engine(old_url: str) -> AsyncIterator[AsyncEngine]:
    async with engine_on(old_url) as engine:
        yield engine


def batch(first_ms: int, step: int, count: int = 1_000, *extra: str) -> list[str]:
    """`count` ids from `first_ms`, `step` ms apart, a consumer's page of an interleaved PEL."""
    return [f"{first_ms + n * step}-{n % 13}" for n in range(count)] + list(extra)


async def reclaimed(
    engine: AsyncEngine, pages: list[tuple[str, str, list[str]]], *, tenant: str = TENANT
) -> None:
    """RECLAIMED rows as the reaper writes them: (stream, consumer, ids) a row."""
    rows = [
        queries.EventRow(
            EventKind.RECLAIMED,
            consumer=consumer,
            stream=stream,
            group_name="g",
            entry_ids="{" + ",".join(ids) + "}",
        )
        for stream, consumer, ids in pages
    ]
    await writes.append_events(engine, tenant=tenant, rows=rows)


async def story_of(engine: AsyncEngine, entry_id: str) -> list[tuple[str | None, str]]:
    rows = await story.timeline(
        engine,
        tenant=TENANT,
        entries=[story.EntryRef(STREAM, entry_id)],
        after=0,
        limit=1_000,
    )
    return [(row.consumer, row.kind) for row in rows]


async def plan(engine: AsyncEngine, entry_id: str) -> str:
    """The timeline's plan with sequential scans priced out: an index its RECLAIMED branch can
    use shows up in it, one it cannot does not."""
    params = {
        "tenant": TENANT,
        "streams": [STREAM],
        "ids": [entry_id],
        "kinds": list(story.STORY_KINDS),
        "after": 0,
        "limit": 10,
    }
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        found = await conn.execute(text("EXPLAIN " + story._TIMELINE.text), params)
        return "\n".join(line for (line,) in found)


async def indexes(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        found = await conn.execute(
            text("SELECT indexname FROM pg_indexes WHERE tablename = 'events'")
        )
        return {name for (name,) in found}


async def test_the_story_finds_every_batch_naming_an_entry_written_before_and_after_0020(
    engine: AsyncEngine, old_url: str
) -> None:
    # Written before 0020 (the index is built over them): twenty consumers' pages of one
    # interleaved PEL, the target in c0's; the same id on another stream and in another tenant.
    await reclaimed(engine, [(STREAM, f"c{n}", batch(1700000000000 + n, 20)) for n in range(20)])
    await reclaimed(engine, [(OTHER, "o", batch(1700000009000, 1, 10, TARGET))])
    await reclaimed(engine, [(STREAM, "t", [TARGET])], tenant="elsewhere")
    migrations.upgrade(old_url)
    found = await story_of(engine, TARGET)
    assert found == [("c0", "RECLAIMED")], "c0's 501st id: 1700000000000 + 500 x 20, seq 500 % 13"

    # Written after: a page far later, one with an id that is not a stream id (its
    # span is unbounded, so it is found and `entry_ids` decides), and two that merely span it.
    await reclaimed(
        engine,
        [
            (STREAM, "late", batch(1800000000000, 1)),
            (STREAM, "odd", ["not-an-id", TARGET]),
            (STREAM, "wide", ["1600000000000-0", "1900000000000-0"]),
            (STREAM, "again", ["1700000009999-0", TARGET]),
        ],
    )
    assert await story_of(engine, TARGET) == [
        ("c0", "RECLAIMED"),
        ("odd", "RECLAIMED"),
        ("again", "RECLAIMED"),
    ]
    assert await story_of(engine, "1700000010000-8") == [], "the time matches, the id does not"

    found = await indexes(engine)
    assert "ix_events_entry_span" in found and "ix_events_entry_ids" not in found
    assert "ix_events_entry_span" in await plan(engine, TARGET)

    # Down again: 0018's GIN index is back for the previous release.
    command.downgrade(migrations.alembic_config(old_url), BEFORE)
    found = await indexes(engine)
    assert "ix_events_entry_ids" in found and "ix_events_entry_span" not in found


async def test_a_batchs_span_is_its_times_and_never_fails_an_insert(
    engine: AsyncEngine, old_url: str
) -> None:
    migrations.upgrade(old_url)
    cases = {
        "{3-5,1-0,2-9}": "[1,4)",
        "{1700000000000-0}": "[1700000000000,1700000000001)",
        "{abc-1,5-0}": "(,)",
        "{99999999999999999999999-0}": "(,)",
        "{}": "(,)",
    }
    async with engine.begin() as conn:
        for ids, span in cases.items():
            got = await conn.execute(
                text("SELECT CAST(rig_entry_span(CAST(:ids AS text[])) AS text)"), {"ids": ids}
            )
            assert got.scalar_one() == span, ids
    await reclaimed(engine, [(STREAM, "odd", ["abc-1", "99999999999999999999999-0"])])
    async with engine.connect() as conn:
        count = await conn.execute(text("SELECT count(*) FROM events WHERE consumer = 'odd'"))
        assert count.scalar_one() == 1
