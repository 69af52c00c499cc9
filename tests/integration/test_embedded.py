"""The embedded servers of `make run` and of a newcomer's `make test`: reachable as real servers
are (PostgreSQL on loopback TCP, which Spark's JDBC driver needs), and gone when closed."""

from __future__ import annotations

import os
import pwd
import socket
import tempfile
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from rig_conductor.embedded import postgres_server

pytest.importorskip("pgserver")
psutil = pytest.importorskip("psutil")  # pgserver's own dependency


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


@pytest.mark.skipif(
    os.geteuid() != 0, reason="only root's embedded PostgreSQL runs as another user"
)
def test_as_root_the_embedded_postgresql_runs_as_nobody_and_creates_no_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    users = {entry.pw_name for entry in pwd.getpwall()}
    monkeypatch.setenv("PATH", "/nonexistent")  # no useradd to be found, as off /usr/sbin
    with (
        tempfile.TemporaryDirectory(prefix="rig-test-embedded-") as scratch,
        postgres_server(Path(scratch), database="rig_embedded") as (url, _),
    ):
        pid = int((Path(scratch) / "pg" / "postmaster.pid").read_text().split()[0])
        assert psutil.Process(pid).username() == "nobody"
        assert listening(make_url(url).port or 0)
    assert {entry.pw_name for entry in pwd.getpwall()} == users


@pytest.mark.skipif(
    os.geteuid() != 0, reason="only root's embedded PostgreSQL runs as another user"
)
def test_as_root_it_says_which_closed_directories_it_opens_for_passing_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with tempfile.TemporaryDirectory(prefix="rig-test-closed-") as closed:  # mode 0700
        scratch = Path(closed) / "scratch"
        scratch.mkdir(mode=0o700)
        with postgres_server(scratch, database="rig_embedded") as (url, _):
            assert listening(make_url(url).port or 0)
        assert Path(closed).stat().st_mode & 0o777 == 0o701  # enter, not list
    [opened] = [r.getMessage() for r in caplog.records if "pass through" in r.getMessage()]
    assert f"letting `nobody` pass through {scratch}, {closed} (o+x: enter, not list)" in opened
