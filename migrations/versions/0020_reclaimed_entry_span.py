"""Find the reclaims of one entry by the span of times its batch covers, not by each id.

Migration 0018 put a GIN index on the event log's `entry_ids`: every id of every RECLAIMED
batch became an index entry. At a million moved entries that index was PostgreSQL's whole cost
of a reclaim (about 4 s of its CPU here, against 20 ms for the rows themselves), on the same
cores the reaper and Redis were using. A batch is now indexed once, by the span of the
millisecond parts of its ids (`rig_entry_span`, a GiST index on an int8range): the story of a
piece of work (`GET /api/work/{issueId}`) finds the batches whose span holds its entry's time,
then keeps those whose `entry_ids` name the entry.

`rig_entry_span` never fails an insert: a batch with an id that is not `<ms>-<seq>` gets the
unbounded span, which every lookup finds (and `entry_ids` then decides).

Safe for a rolling upgrade: the previous release (0.1.0, schema 0015) has neither index and
reads no story; its RECLAIMED rows carry `entry_ids` as these do, and the expression indexes
them as it does this release's.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

# plpgsql: one pass over the ids, about 0.6 us an id here (a SQL min/max over unnest is 3x that).
SPAN_FUNCTION = """
CREATE OR REPLACE FUNCTION rig_entry_span(ids text[]) RETURNS int8range
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    lo bigint;
    hi bigint;
    ms bigint;
    id text;
BEGIN
    FOREACH id IN ARRAY ids LOOP
        ms := split_part(id, '-', 1)::bigint;
        IF lo IS NULL OR ms < lo THEN lo := ms; END IF;
        IF hi IS NULL OR ms > hi THEN hi := ms; END IF;
    END LOOP;
    RETURN int8range(lo, hi, '[]');
EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range THEN
    RETURN int8range(NULL, NULL);
END $$
"""


def upgrade() -> None:
    op.execute(SPAN_FUNCTION)
    op.execute(
        "CREATE INDEX ix_events_entry_span ON events USING gist (rig_entry_span(entry_ids)) "
        "WHERE entry_ids IS NOT NULL"
    )
    op.drop_index("ix_events_entry_ids", table_name="events")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX ix_events_entry_ids ON events USING gin (entry_ids) "
        "WHERE entry_ids IS NOT NULL"
    )
    op.drop_index("ix_events_entry_span", table_name="events")
    op.execute("DROP FUNCTION rig_entry_span(text[])")
