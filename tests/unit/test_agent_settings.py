"""The agent's RIG_* settings and CLI: defaults, and one line exiting 2 on operator mistakes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rig_conductor.agent import cli
from rig_conductor.agent.settings import load_agent_settings
from rig_conductor.settings import SettingsError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    for name in list(os.environ):
        if name.startswith("RIG_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(str(tmp_path))  # no stray .env


def test_defaults_are_the_contract() -> None:
    assert load_agent_settings().describe() == {
        "RIG_REDIS_MODE": "standalone",
        "RIG_REDIS_URL": "redis://localhost:6379/0",
        "RIG_REDIS_SENTINELS": (),
        "RIG_REDIS_SENTINEL_MASTER": "mymaster",
        "RIG_REDIS_SENTINEL_PASSWORD": None,
        "RIG_REDIS_TLS_CA_FILE": None,
        "RIG_REDIS_TLS_CERT_FILE": None,
        "RIG_REDIS_TLS_KEY_FILE": None,
        "RIG_CONDUCTOR_URL": "http://localhost:8080",
        "RIG_API_TOKEN": None,
        "RIG_API_TOKEN_FILE": None,
        "RIG_HEARTBEAT_INTERVAL_S": 10.0,
        "RIG_SCAN_INTERVAL_S": 60.0,
        "RIG_MAX_DELIVERIES": 5,
        "RIG_ENTRY_DEADLINE_MS": 3_600_000,
        "RIG_DISPATCH_STREAM": "rig:dispatch",
        "RIG_LOG_FORMAT": "text",
    }


@pytest.mark.parametrize(
    "name",
    [
        "RIG_API_TOKEN",
        "RIG_API_TOKEN_FILE",
        "RIG_REDIS_SENTINEL_PASSWORD",
        "RIG_REDIS_TLS_CA_FILE",
        "RIG_REDIS_TLS_CERT_FILE",
        "RIG_REDIS_TLS_KEY_FILE",
    ],
)
@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_value_means_the_setting_is_unset(
    monkeypatch: pytest.MonkeyPatch, name: str, blank: str
) -> None:
    # As a chart renders an optional value it was not given: `RIG_X=`. The Redis ones are the
    # shared settings' (settings_base), which the agent's own blank rule must not shadow.
    monkeypatch.setenv(name, blank)
    assert load_agent_settings().describe()[name] is None


def test_choices_are_read_whatever_their_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_LOG_FORMAT", " JSON ")
    monkeypatch.setenv("RIG_REDIS_MODE", "Standalone")
    settings = load_agent_settings()
    assert (settings.log_format, settings.redis_mode) == ("json", "standalone")


def test_values_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_API_TOKEN", "s3cret")
    monkeypatch.setenv("RIG_HEARTBEAT_INTERVAL_S", "0.5")
    monkeypatch.setenv("RIG_REDIS_URL", "redis://user:pw@redis:6379/1")
    monkeypatch.setenv("RIG_CONDUCTOR_URL", "https://conductor.rig.svc:8443/")
    settings = load_agent_settings()
    assert settings.token == "s3cret"
    assert settings.lease_ttl_ms == 1500
    assert settings.conductor_url == "https://conductor.rig.svc:8443"
    shown = settings.describe()
    assert shown["RIG_API_TOKEN"] == "<set>"
    assert shown["RIG_REDIS_URL"] == "redis://user:***@redis:6379/1"
    assert "s3cret" not in str(shown) and "pw" not in str(shown)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RIG_HEARTBEAT_INTERVAL_S", "0"),
        ("RIG_HEARTBEAT_INTERVAL_S", "soon"),
        ("RIG_SCAN_INTERVAL_S", "-1"),
        ("RIG_MAX_DELIVERIES", "0"),
        ("RIG_REDIS_URL", "localhost:6379"),
        ("RIG_CONDUCTOR_URL", "ftp://conductor"),
        ("RIG_CONDUCTOR_URL", "http://"),
        ("RIG_DISPATCH_STREAM", ""),
        ("RIG_LOG_FORMAT", "xml"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_agent_settings()
    assert str(caught.value).startswith(f"{variable}: ")
    assert "\n" not in str(caught.value)


def test_the_token_may_come_from_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("  projected.jwt.token\n")
    monkeypatch.setenv("RIG_API_TOKEN_FILE", str(tmp_path / "token"))
    settings = load_agent_settings()
    assert settings.api_token_file == tmp_path / "token"
    assert settings.token is None  # read per request by the conductor client, not here
    assert "projected" not in str(settings.describe())


def test_a_token_and_a_token_file_together_are_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("projected.jwt.token")
    monkeypatch.setenv("RIG_API_TOKEN", "s3cret-s3cret-s3cret")
    monkeypatch.setenv("RIG_API_TOKEN_FILE", str(tmp_path / "token"))
    with pytest.raises(SettingsError) as caught:
        load_agent_settings()
    assert str(caught.value).startswith("RIG_API_TOKEN_FILE: RIG_API_TOKEN and RIG_API_TOKEN_FILE")
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("content", [None, b"", b"  \n", b"\xff\xfe"])
def test_an_unusable_token_file_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: bytes | None,
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setenv("RIG_API_TOKEN_FILE", str(path))
    assert cli.main(_args("--agent-id", "a", "--group", "g", "--handler", "json:dumps")) == 2
    err = capsys.readouterr().err
    assert err.startswith("rig-conductor: RIG_API_TOKEN_FILE: ") and str(path) in err
    assert err.count("\n") == 1


def test_secrets_are_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_REDIS_URL", "mysql://root:hunter2@db")
    with pytest.raises(SettingsError) as caught:
        load_agent_settings()
    assert "hunter2" not in str(caught.value)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    cli.add_parser(sub)
    return parser.parse_args(["agent", *argv])


def test_the_subcommand_parses_the_contract_flags() -> None:
    args = _args("--agent-id", "dev-e", "--group", "builders", "--handler", "m:f")
    assert (args.agent_id, args.group, args.stream, args.start_id, args.handler) == (
        "dev-e",
        "builders",
        None,
        "0",
        "m:f",
    )
    assert args.command.__name__ == "_command"
    args = _args(
        "--agent-id", "a", "--group", "g", "--stream", "s", "--start-id", "$", "--handler", "m:f"
    )
    assert (args.stream, args.start_id) == ("s", "$")


def test_a_bad_start_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        _args("--agent-id", "a", "--group", "g", "--start-id", "later", "--handler", "m:f")
    assert caught.value.code == 2
    assert "--start-id" in capsys.readouterr().err


def test_a_bad_setting_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RIG_HEARTBEAT_INTERVAL_S", "-3")
    assert cli.main(_args("--agent-id", "a", "--group", "g", "--handler", "json:dumps")) == 2
    err = capsys.readouterr().err
    assert err.startswith("rig-conductor: RIG_HEARTBEAT_INTERVAL_S: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize("spec", ["json", "no_such_module_xyz:run", "json:nope", "json:__doc__"])
def test_a_bad_handler_exits_2_with_one_line(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(_args("--agent-id", "a", "--group", "g", "--handler", spec)) == 2
    err = capsys.readouterr().err
    assert err.startswith("rig-conductor: --handler ")
    assert err.count("\n") == 1


def test_the_module_runs_as_a_program_and_says_what_is_wrong() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rig_conductor.agent.cli",
            "--agent-id",
            "a",
            "--group",
            "g",
            "--handler",
            "not_a_module_xyz:run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("rig-conductor: --handler 'not_a_module_xyz:run': cannot import")
    assert "Traceback" not in done.stderr
