"""Find the reclaims of one entry: a GIN index on the event log's `entry_ids`.

A RECLAIMED row names the batch of entries moved together in `entry_ids`; the story of one
piece of work (`GET /api/work/{issueId}`) looks its entries up there with `entry_ids && ...`,
which without this index reads every RECLAIMED row. Only rows that name a batch are indexed.
Expand-only: the previous release neither reads nor needs it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_events_entry_ids",
        "events",
        ["entry_ids"],
        postgresql_using="gin",
        postgresql_where=sa.text("entry_ids IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_events_entry_ids", table_name="events")
