"""The reaper's lease: one row per tenant naming the replica that runs the scheduled scan, when
Kubernetes is off. It replaces a session advisory lock, which PgBouncer in transaction pooling
mode cannot keep (a session lock lives on one server connection; the pooler hands each
transaction to any). Every time in it is PostgreSQL's `now()`: the one clock replicas share.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reaper_lease",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("holder", sa.Text),  # NULL once released
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("reaper_lease")
