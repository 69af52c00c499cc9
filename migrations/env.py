"""Alembic environment: runs migrations online against the URL the caller configured."""

from __future__ import annotations

from alembic import context

from rig_conductor.adapters.postgres.engine import create_sync_engine
from rig_conductor.adapters.postgres.tables import metadata

config = context.config
url = config.get_main_option("sqlalchemy.url")
if not url:
    raise RuntimeError("sqlalchemy.url is not set: run migrations through `rig-conductor migrate`")

connectable = create_sync_engine(url)
with connectable.connect() as connection:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        # Two replicas migrating at once would race on alembic_version; one waits for the other.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7314906)")
        context.run_migrations()
connectable.dispose()
