"""Events about many entries at once: reclaims are recorded one row per batch.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("events", sa.Column("entry_ids", ARRAY(sa.Text)))


def downgrade() -> None:
    op.drop_column("events", "entry_ids")
