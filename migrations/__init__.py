"""Alembic migration scripts, installed as rig_conductor._migrations."""
