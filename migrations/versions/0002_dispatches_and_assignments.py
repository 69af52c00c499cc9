"""Idempotent dispatches, per-entry assignment state with attempts, fenced events.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dispatches",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("idempotency_key", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, nullable=False),
        sa.Column("entry_id", sa.Text, nullable=False),
        sa.Column("issue_id", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_dispatches_entry", "dispatches", ["stream", "entry_id"])
    op.create_table(
        "assignments",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("entry_id", sa.Text, primary_key=True),
        sa.Column("issue_id", sa.Text),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("consumer", sa.Text),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'running', 'done', 'failed', 'dead')", name="ck_assignments_state"
        ),
    )
    op.add_column(
        "events", sa.Column("fenced", sa.Boolean, nullable=False, server_default=sa.text("false"))
    )


def downgrade() -> None:
    op.drop_column("events", "fenced")
    op.drop_table("assignments")
    op.drop_table("dispatches")
