"""Operator mistakes on the command line: one line each, naming the variable to fix, and how.

Nothing reachable, a database that does not exist: `check`, `migrate` and `serve` answer with
one line per failure, no traceback, each naming RIG_REDIS_URL or RIG_DATABASE_URL.
"""

from __future__ import annotations

import socket
import uuid

from sqlalchemy.engine import make_url

from .test_cli import run

NOWHERE = {
    # Port 1 on loopback: refused at once, as a server that is not running.
    "RIG_REDIS_URL": "redis://127.0.0.1:1/0",
    "RIG_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:1/rig",
}


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def test_check_with_nothing_reachable_prints_one_line_per_dependency_naming_its_variable() -> None:
    done = run("check", env=NOWHERE)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    redis, postgres = sorted(lines, key=lambda line: "PostgreSQL" in line)
    assert "Redis unreachable (RIG_REDIS_URL)" in redis
    assert "PostgreSQL unreachable (RIG_DATABASE_URL)" in postgres
    assert "Traceback" not in done.stderr


def missing_database(database_url: str) -> tuple[str, str]:
    name = f"rig_missing_{uuid.uuid4().hex[:8]}"
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    return name, url


def test_a_missing_database_says_how_to_create_it_in_check_migrate_and_serve(
    redis_url: str, database_url: str
) -> None:
    name, url = missing_database(database_url)
    env = {"RIG_REDIS_URL": redis_url, "RIG_DATABASE_URL": url, "RIG_ALLOW_ANONYMOUS": "true"}
    for command, code in (("check", 1), ("migrate", 1), ("serve", 2)):
        done = run(command, env={**env, "RIG_HTTP_PORT": "1"})
        assert done.returncode == code, (command, done.stderr)
        [line] = errors(done.stderr)
        assert f'PostgreSQL has no database "{name}" (RIG_DATABASE_URL)' in line, line
        assert f"`createdb {name}`" in line and f'`CREATE DATABASE "{name}"`' in line, line
        assert "`rig-conductor migrate` creates tables, not databases" in line, line
        assert "Traceback" not in done.stderr


def test_migrate_against_no_server_names_rig_database_url() -> None:
    done = run("migrate", env=NOWHERE)
    assert done.returncode == 1
    [line] = errors(done.stderr)
    assert "Migration failed: PostgreSQL unreachable (RIG_DATABASE_URL)" in line, line
    assert "Traceback" not in done.stderr


def test_serve_against_no_database_names_rig_database_url() -> None:
    done = run("serve", env={**NOWHERE, "RIG_ALLOW_ANONYMOUS": "true", "RIG_HTTP_PORT": "1"})
    assert done.returncode == 2
    [line] = errors(done.stderr)
    assert "PostgreSQL unreachable (RIG_DATABASE_URL)" in line, line
    assert "Traceback" not in done.stderr


def test_demo_once_and_keep_running_contradict_in_one_line() -> None:
    done = run("demo", "--once", "--keep-running", env={})
    assert done.returncode == 2
    assert done.stderr == "rig-conductor: demo: --once and --keep-running contradict\n"


def test_serve_on_a_taken_port_names_rig_http_port(redis_url: str, database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            "RIG_REDIS_URL": redis_url,
            "RIG_DATABASE_URL": database_url,
            "RIG_ALLOW_ANONYMOUS": "true",
            "RIG_HTTP_HOST": "127.0.0.1",
            "RIG_HTTP_PORT": str(port),
        }
        done = run("serve", env=env)
    assert done.returncode != 0
    assert f"Could not serve on 127.0.0.1:{port}: choose another RIG_HTTP_HOST / RIG_HTTP_PORT" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
