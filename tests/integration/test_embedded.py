"""The embedded servers of `make run` and of a newcomer's `make test`: reachable as real servers
are (PostgreSQL on loopback TCP, which Spark's JDBC driver needs), and gone when closed."""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from rig_conductor.embedded import postgres_server

pytest.importorskip("pgserver")


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_embedded_postgresql_listens_on_loopback_and_stops_when_closed() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="rig-test-embedded-") as scratch,
        postgres_server(Path(scratch), database="rig_embedded") as (url, admin_url),
    ):
        parsed = make_url(url)
        assert (parsed.host, parsed.database) == ("127.0.0.1", "rig_embedded")
        assert parsed.port is not None and listening(parsed.port)
        assert make_url(admin_url).database == "postgres"
        conninfo = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(conninfo) as conn:
            row = conn.execute("SELECT current_database(), inet_server_addr()::text").fetchone()
        assert row == ("rig_embedded", "127.0.0.1/32")
    assert not listening(parsed.port)
