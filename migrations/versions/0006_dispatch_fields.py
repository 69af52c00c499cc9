"""Dispatch fields: what each dispatch appended, so that a dispatch a Redis failover lost (written
to the old master, never replicated) can be appended again, once, under its idempotency key.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("dispatches", sa.Column("fields", postgresql.JSONB, nullable=True))
    op.create_index("ix_dispatches_created", "dispatches", ["tenant", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_dispatches_created", table_name="dispatches")
    op.drop_column("dispatches", "fields")
