"""Staged outputs recorded with the completion that accepts them.

An accepted WORK_COMPLETED that staged files records them (`outputs`: the staged and final
paths) in the same transaction that marks the entry done; `published_at` is set when an agent
reports them renamed onto their paths (WORK_PUBLISHED). Until then the record is what whoever
holds the entry next, or the conductor's recovery after Redis lost its data, finishes. Both
columns are new and nullable: the previous release neither reads nor writes them.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("assignments", sa.Column("outputs", JSONB))
    op.add_column("assignments", sa.Column("published_at", sa.DateTime(timezone=True)))
    # The few done entries whose outputs still wait for their rename, for each scan's evidence.
    op.create_index(
        "ix_assignments_unpublished",
        "assignments",
        ["tenant", "stream"],
        postgresql_where=sa.text("outputs IS NOT NULL AND published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_assignments_unpublished", table_name="assignments")
    op.drop_column("assignments", "published_at")
    op.drop_column("assignments", "outputs")
