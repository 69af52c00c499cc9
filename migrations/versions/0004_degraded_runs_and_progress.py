"""Degraded runs and per-entry progress: the evidence of reaper rules 3b and 4b.

- `degraded_since` on the heartbeat tables: receipt time of the first heartbeat of the
  unbroken degraded run (for an agent, of its heartbeats that name no consumer); NULL when the
  latest such heartbeat was healthy.
- `progress_at` on assignments: the last sign of progress of the entry's current attempt
  (WORK_STARTED, WORK_PROGRESS, or the reclaim that reserved the attempt).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("agent_heartbeats", "consumer_heartbeats"):
        op.add_column(table, sa.Column("degraded_since", sa.DateTime(timezone=True)))
        # A row that is degraded now starts its run at its latest heartbeat: the earlier
        # history was not kept.
        op.execute(f"UPDATE {table} SET degraded_since = last_heartbeat_at WHERE degraded")
    op.add_column("assignments", sa.Column("progress_at", sa.DateTime(timezone=True)))
    op.execute("UPDATE assignments SET progress_at = updated_at")


def downgrade() -> None:
    op.drop_column("assignments", "progress_at")
    for table in ("agent_heartbeats", "consumer_heartbeats"):
        op.drop_column(table, "degraded_since")
