"""Heartbeat state per agent and per consumer, and the append-only event log.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _state_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("degraded", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("degraded_reasons", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column(
            "first_seen_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.now(),
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "agent_heartbeats",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("agent_id", sa.Text, primary_key=True),
        *_state_columns(),
    )
    op.create_table(
        "consumer_heartbeats",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column("agent_id", sa.Text, nullable=False),
        *_state_columns(),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column(
            "occurred_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text),
        sa.Column("consumer", sa.Text),
        sa.Column("stream", sa.Text),
        sa.Column("group_name", sa.Text),
        sa.Column("entry_id", sa.Text),
        sa.Column("issue_id", sa.Text),
        sa.Column("attempt", sa.Integer),
        sa.Column("detail", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.create_index("ix_events_occurred_at", "events", ["occurred_at"])
    op.create_index("ix_events_stream_entry", "events", ["stream", "entry_id"])
    op.create_index("ix_events_issue", "events", ["issue_id"])


def downgrade() -> None:
    op.drop_table("events")
    op.drop_table("consumer_heartbeats")
    op.drop_table("agent_heartbeats")
