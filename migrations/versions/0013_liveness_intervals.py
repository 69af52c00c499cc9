"""Heartbeats cost O(changes), not O(beats), in durable storage: the liveness history as
intervals. The heartbeat tables keep the open interval (`heard_since`, `beats`); an interval
that ends (a gap longer than RIG_AGENT_DOWN_MS, or `degraded` changed) becomes a `liveness`
row. Heartbeats no longer go to the event log; the audit reads the intervals, and the
HEARTBEAT events written before this revision as intervals of one beat.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("agent_heartbeats", "consumer_heartbeats"):
        op.add_column(table, sa.Column("heard_since", sa.DateTime(timezone=True)))
        op.add_column(
            table, sa.Column("beats", sa.BigInteger, nullable=False, server_default=sa.text("0"))
        )
    op.create_table(
        "liveness",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("consumer", sa.Text),
        sa.Column("heard_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heard_to", sa.DateTime(timezone=True), nullable=False),
        sa.Column("degraded", sa.Boolean, nullable=False),
        sa.Column("beats", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_liveness_heard_to", "liveness", ["heard_to"])


def downgrade() -> None:
    op.drop_index("ix_liveness_heard_to", table_name="liveness")
    op.drop_table("liveness")
    for table in ("agent_heartbeats", "consumer_heartbeats"):
        op.drop_column(table, "beats")
        op.drop_column(table, "heard_since")
