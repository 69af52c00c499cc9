"""What the last scan measured, for the views: per group (pending, consumers, consumers down and
what they hold, the oldest pending entry's idle time, the stream's dead letters, the ten
consumers holding most) and per
tenant (agents up, down and degraded). The views read these instead of Redis and every
heartbeat row, so a console tab costs the same at a million consumers as at ten.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "group_measurements",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("group_name", sa.Text, primary_key=True),
        sa.Column("pending", sa.BigInteger, nullable=False),
        sa.Column("consumers", sa.BigInteger, nullable=False),
        sa.Column("consumers_down", sa.BigInteger, nullable=False),
        sa.Column("held_by_down", sa.BigInteger, nullable=False),
        sa.Column("oldest_idle_ms", sa.BigInteger),
        sa.Column("dead_letters", sa.BigInteger, nullable=False),
        sa.Column("top", JSONB, nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "fleet_measurements",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("agents_up", sa.BigInteger, nullable=False),
        sa.Column("agents_down", sa.BigInteger, nullable=False),
        sa.Column("agents_degraded", sa.BigInteger, nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("fleet_measurements")
    op.drop_table("group_measurements")
