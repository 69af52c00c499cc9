"""Redis epochs: the marker the conductor keeps beside each dispatch stream in Redis, remembered
here, so a scan can tell that Redis lost its data (restarted empty, flushed, failed over to an
empty replica) and append every unfinished dispatch again. And the assignment state
`superseded`: an entry Redis lost whose dispatch was appended again as a new entry; its
attempts are fenced off, so work on the lost entry never counts beside the new one's.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_STATES = "'pending', 'running', 'done', 'failed', 'dead'"


def upgrade() -> None:
    op.create_table(
        "redis_epochs",
        sa.Column("tenant", sa.Text, primary_key=True),
        sa.Column("stream", sa.Text, primary_key=True),
        sa.Column("epoch", sa.Text, nullable=False),
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.drop_constraint("ck_assignments_state", "assignments", type_="check")
    op.create_check_constraint(
        "ck_assignments_state", "assignments", f"state IN ({_STATES}, 'superseded')"
    )


def downgrade() -> None:
    # A superseded entry is gone from Redis for good: as far as the older schema can say, dead.
    op.execute("UPDATE assignments SET state = 'dead' WHERE state = 'superseded'")
    op.drop_constraint("ck_assignments_state", "assignments", type_="check")
    op.create_check_constraint("ck_assignments_state", "assignments", f"state IN ({_STATES})")
    op.drop_table("redis_epochs")
