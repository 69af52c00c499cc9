"""Registry indexes: page the agents and their consumers in keyset order, list an agent's
freshest consumers, and find the agents and consumers silent past RIG_AGENT_FORGET_MS, each
with an index range scan rather than a read of every row.

Agents are paged on the primary key (tenant, agent_id); consumers need their own.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_consumer_heartbeats_agent",
        "consumer_heartbeats",
        ["tenant", "agent_id", "consumer"],
    )
    op.create_index(
        "ix_consumer_heartbeats_agent_fresh",
        "consumer_heartbeats",
        ["tenant", "agent_id", sa.text("last_heartbeat_at DESC"), "consumer"],
    )
    op.create_index(
        "ix_consumer_heartbeats_heard", "consumer_heartbeats", ["tenant", "last_heartbeat_at"]
    )
    op.create_index(
        "ix_agent_heartbeats_heard", "agent_heartbeats", ["tenant", "last_heartbeat_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_agent_heartbeats_heard", table_name="agent_heartbeats")
    op.drop_index("ix_consumer_heartbeats_heard", table_name="consumer_heartbeats")
    op.drop_index("ix_consumer_heartbeats_agent_fresh", table_name="consumer_heartbeats")
    op.drop_index("ix_consumer_heartbeats_agent", table_name="consumer_heartbeats")
