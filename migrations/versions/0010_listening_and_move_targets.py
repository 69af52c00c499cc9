"""Evidence the conductor must not mistake for its fleet's: the stretches in which some
conductor was listening for heartbeats (`listening`: the gaps are blind spells, reaper rule 3),
and the latest move the conductor made to each consumer of a group (`move_targets`: the XCLAIM
reset the target's idle time, which rule 5 must not take as a sign of life).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "listening",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("replica", sa.Text, nullable=False),
        sa.Column(
            "heard_from", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "heard_to", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_listening_tenant", "listening", ["tenant", "heard_to"])
    op.create_table(
        "move_targets",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("group_name", sa.Text, primary_key=True),
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column(
            "moved_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_move_targets_moved", "move_targets", ["tenant", "moved_at"])


def downgrade() -> None:
    op.drop_index("ix_move_targets_moved", table_name="move_targets")
    op.drop_table("move_targets")
    op.drop_index("ix_listening_tenant", table_name="listening")
    op.drop_table("listening")
