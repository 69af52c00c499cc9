"""Work is owned per group: the attempts of a stream entry in each consumer group that reads it.

`assignments` keeps one row per entry, now claimed by the first group that works on it
(`group_name`; NULL for rows written before this release, which belong to whichever group
reports on them first); the entry's attempts in any other group live in `group_assignments`,
keyed by the group too. So the previous release, which reads and writes `assignments` by
(tenant, stream, entry_id), keeps working beside this one on the same rows during a rolling
upgrade: nothing it reads is changed or removed.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("assignments", sa.Column("group_name", sa.Text))
    op.create_table(
        "group_assignments",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("group_name", sa.Text, primary_key=True),
        sa.Column("entry_id", sa.Text, primary_key=True),
        sa.Column("issue_id", sa.Text),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("consumer", sa.Text),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("progress_at", sa.DateTime(timezone=True)),
        sa.Column("outputs", JSONB),
        sa.Column("published_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'failed', 'dead', 'superseded')",
            name="ck_group_assignments_state",
        ),
    )
    op.create_index(
        "ix_group_assignments_entry", "group_assignments", ["tenant", "stream", "entry_id"]
    )
    op.create_index(
        "ix_group_assignments_unpublished",
        "group_assignments",
        ["tenant", "stream"],
        postgresql_where=sa.text("outputs IS NOT NULL AND published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_table("group_assignments")
    op.drop_column("assignments", "group_name")
