"""Alembic, driven from code: upgrade to head, and tell whether a database is behind.

The migration scripts live in the repository's top-level migrations/ folder, which is
installed as the package `rig_conductor._migrations`.
"""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from rig_conductor.adapters.postgres.engine import create_sync_engine


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(resources.files("rig_conductor._migrations")))
    # ConfigParser interpolation would choke on a '%' in a password.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """`alembic upgrade head`; a database already at head is left as it is."""
    command.upgrade(alembic_config(url), "head")


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def current_revision(url: str) -> str | None:
    engine = create_sync_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def is_current(url: str) -> bool:
    return current_revision(url) == head_revision(url)
