"""A PostgreSQL of the module's own, which its tests may stop and start, and Debian's PgBouncer
in transaction pooling mode in front of it. Skipped (failed under CI) when the binaries are
missing. Each test gets a database of its own on that server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .servers import Binaries, PgBouncer, PrivatePostgres, binaries, pgbouncer, private_postgres


@pytest.fixture(scope="module")
def bins() -> Binaries:
    return binaries()


@pytest.fixture(scope="module")
def private_pg(bins: Binaries) -> Iterator[PrivatePostgres]:
    with private_postgres(bins) as server:
        yield server


@pytest.fixture(scope="module")
def bouncer(bins: Binaries, private_pg: PrivatePostgres) -> Iterator[PgBouncer]:
    with pgbouncer(bins, private_pg) as running:
        yield running


@dataclass(frozen=True)
class Database:
    name: str
    direct_url: str


@pytest.fixture
def database(private_pg: PrivatePostgres) -> Database:
    """A new, empty database on the private server (not migrated: tests say how)."""
    if not private_pg.running():  # a test before stopped it and failed before starting it
        private_pg.start()
    name = f"rig_{uuid.uuid4().hex[:10]}"
    return Database(name, private_pg.create_database(name))


def rig_conductor(*args: str, database_url: str) -> subprocess.CompletedProcess[str]:
    """`rig-conductor <args>` as a process against `database_url`."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment["RIG_DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "rig_conductor", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def metric(client: httpx.AsyncClient, url: str, name: str, **labels: str) -> float:
    """One sample of the /metrics of the conductor at `url` (0 when absent)."""
    text = (await client.get(f"{url}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
