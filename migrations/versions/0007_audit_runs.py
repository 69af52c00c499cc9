"""Audit runs: the verdict of each `rig-conductor audit`, so the conductor can expose the last
one's lost and duplicate counts as metrics (and the shipped alert fire on them).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_runs",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column(
            "finished_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("dispatched", sa.BigInteger, nullable=False),
        sa.Column("lost", sa.BigInteger, nullable=False),
        sa.Column("duplicates", sa.BigInteger, nullable=False),
        sa.Column("output", sa.Text, nullable=False),
    )
    op.create_index("ix_audit_runs_tenant", "audit_runs", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_audit_runs_tenant", table_name="audit_runs")
    op.drop_table("audit_runs")
