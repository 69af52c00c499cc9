"""Scan reports: each scan's report, so the console can show the last scans and plot pending
and reclaims over time on any replica, across restarts.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scan_reports",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column(
            "finished_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        sa.Column("pending", sa.BigInteger, nullable=False),
        sa.Column("reclaimed", sa.BigInteger, nullable=False),
        sa.Column("dead_lettered", sa.BigInteger, nullable=False),
        sa.Column("report", JSONB, nullable=False),
    )
    op.create_index("ix_scan_reports_tenant", "scan_reports", ["tenant", "id"])


def downgrade() -> None:
    op.drop_index("ix_scan_reports_tenant", table_name="scan_reports")
    op.drop_table("scan_reports")
