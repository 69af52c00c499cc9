"""Connecting as operators get it wrong: a user without a permission, a wrong password, a
certificate the client does not trust, a bad mode. Each ends with one line saying which."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from rig_conductor import redis_rights
from rig_conductor.adapters.redis import access as redis_access
from rig_conductor.adapters.redis import client as redis_client
from tests.integration.helpers import free_port

from .conftest import ACL_STREAMS, PASSWORD, acl_admin, agent_url, env_settings
from .servers import Cluster, TlsServer


def run(command: str, env: dict[str, str], database_url: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(env, RIG_DATABASE_URL=database_url, RIG_K8S_ENABLED="false")
    environment.setdefault("RIG_ALLOW_ANONYMOUS", "true")
    environment.setdefault("RIG_STREAMS", "rig:dispatch")
    return subprocess.run(
        [sys.executable, "-m", "rig_conductor", *command.split()],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def user_without_xclaim(acl_server: int) -> Iterator[str]:
    rules = redis_rights.conductor_rules(ACL_STREAMS).replace("+xclaim ", "")
    acl_admin(acl_server).execute_command(
        "ACL", "SETUSER", "no-xclaim", *rules.split(), "on", f">{PASSWORD}"
    )
    yield f"redis://no-xclaim:{PASSWORD}@127.0.0.1:{acl_server}/0"
    acl_admin(acl_server).execute_command("ACL", "DELUSER", "no-xclaim")


def test_a_missing_permission_is_named_at_start(
    user_without_xclaim: str, database_url: str
) -> None:
    env = {"RIG_REDIS_URL": user_without_xclaim, "RIG_HTTP_PORT": str(free_port())}
    served = run("serve", env, database_url)
    assert served.returncode == 2, served.stderr[-2000:]
    (line,) = [line for line in served.stderr.splitlines() if "ERROR" in line]
    assert "Refusing to start" in line and "XCLAIM" in line
    checked = run("check", env, database_url)
    assert checked.returncode == 1 and "XCLAIM" in checked.stderr
    reaped = run("reap --once", env, database_url)
    assert reaped.returncode == 2 and "XCLAIM" in reaped.stderr and reaped.stdout == ""


async def test_the_documented_rules_pass_every_probe_and_the_probes_change_nothing(
    acl_server: int, acl_envs: tuple[dict[str, str], dict[str, str]], database_url: str
) -> None:
    admin = acl_admin(acl_server)
    admin.xadd("rig:dispatch", {"issueId": "rc-1"})
    admin.xgroup_create("rig:dispatch", "workers", id="0")
    admin.xadd("rig:dispatch:dlq", {"originalId": "0-1"})
    before = {key: admin.dump(key) for key in admin.keys("*")}
    for role, env in zip(("conductor", "agent"), acl_envs, strict=True):
        url = agent_url(env["RIG_REDIS_URL"], "builder-a")
        client = redis_client.connect(env_settings({**env, "RIG_REDIS_URL": url}, database_url))
        try:
            streams = ["rig:dispatch", "assignments:*"] if role == "conductor" else ["rig:dispatch"]
            assert (
                await redis_access.missing_permission(
                    client,
                    role=role,  # type: ignore[arg-type]
                    streams=streams,
                    agent_id="builder-a",
                )
                is None
            )
        finally:
            await client.aclose()
    assert {key: admin.dump(key) for key in admin.keys("*")} == before


def test_wrong_password_and_untrusted_certificate_are_told_apart(
    tls_server: TlsServer, acl_server: int, database_url: str
) -> None:
    wrong = {"RIG_REDIS_URL": f"redis://rig-conductor:nope@127.0.0.1:{acl_server}/0"}
    checked = run("check", wrong, database_url)
    assert checked.returncode == 1 and "refused the credentials" in checked.stderr
    untrusted = {"RIG_REDIS_URL": tls_server.url}  # no CA: the test CA is not trusted
    checked = run("check", untrusted, database_url)
    assert checked.returncode == 1 and "certificate" in checked.stderr, checked.stderr[-1500:]
    trusted = {"RIG_REDIS_URL": tls_server.url, "RIG_REDIS_TLS_CA_FILE": str(tls_server.ca)}
    checked = run("check", trusted, database_url)
    assert checked.returncode == 0, checked.stderr[-1500:]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"RIG_REDIS_MODE": "bogus"}, "RIG_REDIS_MODE"),
        ({"RIG_REDIS_MODE": "sentinel"}, "RIG_REDIS_SENTINELS"),
        (
            # Refused before any connection: no server listens there.
            {"RIG_REDIS_MODE": "cluster", "RIG_REDIS_URL": "redis://127.0.0.1:7100/2"},
            "RIG_REDIS_URL",
        ),
        ({"RIG_REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "RIG_REDIS_TLS_CA_FILE"),
    ],
)
def test_bad_topology_settings_exit_2_naming_the_variable(
    env: dict[str, str], variable: str, database_url: str
) -> None:
    for command in ("check", "reap --once"):
        done = run(command, env, database_url)
        assert done.returncode == 2, (command, done.stderr)
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith(variable) or variable in line, line
        assert "Traceback" not in done.stderr


def test_the_documented_rules_with_the_cluster_extra_work_on_a_cluster(
    cluster: Cluster, cluster_env: dict[str, str], database_url: str
) -> None:
    from .servers import client

    rules = redis_rights.conductor_rules(["rig:dispatch"], clustered=True).split()
    for server in cluster.servers:
        client(server.port).execute_command("ACL", "SETUSER", "rig-conductor", *rules, "on", ">pw")
    try:
        env = {
            **cluster_env,
            "RIG_REDIS_URL": f"redis://rig-conductor:pw@127.0.0.1:{cluster.ports[0]}",
        }
        checked = run("check", env, database_url)
        assert checked.returncode == 0, checked.stderr[-2000:]
        reaped = run("reap --once", env, database_url)
        assert reaped.returncode == 0, reaped.stderr[-2000:]
    finally:
        for server in cluster.servers:
            client(server.port).execute_command("ACL", "DELUSER", "rig-conductor")


def test_an_agent_without_a_permission_refuses_to_start_naming_it(
    acl_server: int, database_url: str
) -> None:
    rules = redis_rights.agent_rules("a", ACL_STREAMS).replace("+xreadgroup ", "").split()
    acl_admin(acl_server).execute_command("ACL", "SETUSER", "no-read", *rules, "on", f">{PASSWORD}")
    try:
        env = {"RIG_REDIS_URL": f"redis://no-read:{PASSWORD}@127.0.0.1:{acl_server}/0"}
        command = "agent --agent-id a --group g --handler tests.e2e.handlers:build"
        done = run(command, env, database_url)
    finally:
        acl_admin(acl_server).execute_command("ACL", "DELUSER", "no-read")
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert "Refusing to start" in line and "XREADGROUP" in line and "agent" in line
