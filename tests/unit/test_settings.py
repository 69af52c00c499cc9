"""RIG_* settings: the contract's defaults, parsing, and one clear line for a bad value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rig_conductor import cli
from rig_conductor.settings import Settings, SettingsError, load_settings

CONTRACT_DEFAULTS = {
    "RIG_REDIS_URL": "redis://localhost:6379/0",
    "RIG_DATABASE_URL": "postgresql+psycopg://postgres:***@localhost:5432/rig",
    "RIG_HTTP_HOST": "0.0.0.0",
    "RIG_HTTP_PORT": 8080,
    "RIG_DISPATCH_STREAM": "rig:dispatch",
    "RIG_STREAMS": ("rig:dispatch", "assignments:*"),
    "RIG_AGENT_IDS": (),
    "RIG_ENTRY_STALE_MS": 300_000,
    "RIG_AGENT_DOWN_MS": 600_000,
    "RIG_SCAN_INTERVAL_S": 60.0,
    "RIG_STARTUP_DELAY_S": 60.0,
    "RIG_MAX_DELIVERIES": 5,
    "RIG_ENTRY_DEADLINE_MS": 3_600_000,
    "RIG_RECLAIM_DEGRADED": True,
    "RIG_DEGRADED_GRACE_MS": 300_000,
    "RIG_MAX_CONSUMERS_PER_AGENT": 1000,
    "RIG_AGENT_FORGET_MS": 604_800_000,
    "RIG_DRY_RUN": False,
    "RIG_K8S_ENABLED": "auto",
    "RIG_K8S_NAMESPACE": None,
    "RIG_K8S_LABEL_SELECTOR": "",
    "RIG_API_TOKENS": "<0 tokens>",
    "RIG_OPERATOR_TOKENS": "<0 tokens>",
    "RIG_VIEWER_TOKENS": "<0 tokens>",
    "RIG_AGENT_TOKENS": "<0 tokens>",
    "RIG_ALLOW_ANONYMOUS": False,
    "RIG_FORWARDED_ALLOW_IPS": (),
    "RIG_HTTP_ROOT_PATH": "",
    "RIG_LOG_FORMAT": "text",
    "RIG_TENANT": "default",
    "RIG_EVENT_RETENTION_DAYS": 30,
    "RIG_REDIS_MODE": "standalone",
    "RIG_REDIS_SENTINELS": (),
    "RIG_REDIS_SENTINEL_MASTER": "mymaster",
    "RIG_REDIS_SENTINEL_PASSWORD": None,
    "RIG_REDIS_TLS_CA_FILE": None,
    "RIG_REDIS_TLS_CERT_FILE": None,
    "RIG_REDIS_TLS_KEY_FILE": None,
    "RIG_REDIS_WAIT_REPLICAS": 0,
    "RIG_SESSION_SECRET": None,
    "RIG_K8S_AGENT_AUTH": False,
    "RIG_K8S_TOKEN_AUDIENCE": "rig-conductor",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("RIG_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(str(tmp_path))  # no stray .env


def test_defaults_are_the_contract() -> None:
    assert load_settings().describe() == CONTRACT_DEFAULTS


def test_environment_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_STREAMS", " rig:dispatch , assignments:* ,")
    monkeypatch.setenv("RIG_AGENT_IDS", "review-e,review-e-codex")
    monkeypatch.setenv("RIG_SCAN_INTERVAL_S", "0.5")
    monkeypatch.setenv("RIG_STARTUP_DELAY_S", "0")
    monkeypatch.setenv("RIG_DRY_RUN", "true")
    monkeypatch.setenv("RIG_K8S_ENABLED", "FALSE")
    monkeypatch.setenv("RIG_LOG_FORMAT", "json")
    monkeypatch.setenv("RIG_API_TOKENS", "s3cret-token-0123,other-token-01234")
    monkeypatch.setenv("RIG_FORWARDED_ALLOW_IPS", "10.1.2.3/8, 127.0.0.1,")
    settings = load_settings()
    assert settings.streams == ("rig:dispatch", "assignments:*")
    assert settings.agent_ids == ("review-e", "review-e-codex")
    assert settings.scan_interval_s == 0.5
    assert settings.startup_delay_s == 0
    assert settings.dry_run is True
    assert settings.k8s_enabled == "false"
    assert settings.log_format == "json"
    assert [t.get_secret_value() for t in settings.api_tokens] == [
        "s3cret-token-0123",
        "other-token-01234",
    ]
    # A network in the canonical form the proxy middleware matches (else it would trust nobody).
    assert settings.forwarded_allow_ips == ("10.0.0.0/8", "127.0.0.1")
    assert "s3cret" not in repr(settings.describe())


def test_dotenv_file_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from pathlib import Path

    Path(".env").write_text("RIG_TENANT=acme\n")
    assert load_settings().tenant == "acme"


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("RIG_ENTRY_STALE_MS", "-5", "greater than or equal to 0"),
        ("RIG_ENTRY_STALE_MS", "soon", "valid integer"),
        ("RIG_AGENT_DOWN_MS", "0", "greater than 0"),
        ("RIG_AGENT_FORGET_MS", "0", "greater than 0"),
        ("RIG_AGENT_FORGET_MS", "599999", "at least RIG_AGENT_DOWN_MS (600000)"),
        ("RIG_SCAN_INTERVAL_S", "0", "greater than 0"),
        ("RIG_STARTUP_DELAY_S", "-1", "greater than or equal to 0"),
        ("RIG_MAX_DELIVERIES", "0", "greater than or equal to 1"),
        ("RIG_HTTP_PORT", "70000", "less than or equal to 65535"),
        ("RIG_LOG_FORMAT", "xml", "'text' or 'json'"),
        ("RIG_K8S_ENABLED", "maybe", "'true', 'false' or 'auto'"),
        ("RIG_DRY_RUN", "perhaps", "valid boolean"),
        ("RIG_K8S_AGENT_AUTH", "perhaps", "valid boolean"),
        ("RIG_K8S_TOKEN_AUDIENCE", "", "at least 1 character"),
        ("RIG_REDIS_URL", "localhost:6379", "redis://"),
        ("RIG_DATABASE_URL", "not a url", "database URL"),
        ("RIG_DATABASE_URL", "mysql://u@h/db", "postgresql://"),
        ("RIG_STREAMS", " , ", "at least one stream"),
        ("RIG_EVENT_RETENTION_DAYS", "0", "greater than or equal to 1"),
        ("RIG_SESSION_SECRET", "too-short", "at least 32 characters"),
        ("RIG_API_TOKENS", "long-enough-token-1,short", "at least 16 characters"),
        ("RIG_OPERATOR_TOKENS", "fifteen-chars-x", "at least 16 characters"),
        ("RIG_VIEWER_TOKENS", "viewer", "at least 16 characters"),
        ("RIG_AGENT_TOKENS", "dev-e:short", "at least 16 characters"),
        ("RIG_AGENT_TOKENS", "no-agent-named-here-0123", "`<agentId>:<token>`"),
        ("RIG_AGENT_TOKENS", ":no-agent-before-the-colon", "`<agentId>:<token>`"),
        ("RIG_FORWARDED_ALLOW_IPS", "10.0.0.1,proxy.local", "'proxy.local' is not an IP"),
        ("RIG_FORWARDED_ALLOW_IPS", "10.0.0.0/33", "'10.0.0.0/33' is not an IP"),
        ("RIG_MAX_CONSUMERS_PER_AGENT", "0", "greater than or equal to 1"),
        ("RIG_ALLOW_ANONYMOUS", "sometimes", "valid boolean"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert fragment in message
    assert "\n" not in message


def test_bound_tokens_pair_an_agent_with_the_token_after_the_last_colon(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "RIG_AGENT_TOKENS", "dev-e:token-of-dev-e-0123, ns:agent:token-of-ns-agent-0"
    )
    assert load_settings().bound_tokens == [
        ("dev-e", b"token-of-dev-e-0123"),
        ("ns:agent", b"token-of-ns-agent-0"),
    ]


def test_secrets_are_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_REDIS_URL", "http://user:hunter2@redis")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value)
    monkeypatch.delenv("RIG_REDIS_URL")
    monkeypatch.setenv("RIG_VIEWER_TOKENS", "hunter2")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("values", "refused"),
    [
        ({}, True),
        ({"allow_anonymous": True}, False),
        ({"api_tokens": "dispatcher-token-01"}, False),
        ({"operator_tokens": "operator-token-01"}, False),
        ({"viewer_tokens": "viewer-token-0123"}, False),
        ({"agent_tokens": "dev-e:agent-token-01234"}, False),
    ],
)
def test_serve_needs_a_credential_or_anonymous_on_purpose(
    values: dict[str, object], refused: bool
) -> None:
    problem = Settings(**values).anonymous_problem()
    assert (problem is not None) is refused
    if problem is not None:
        assert problem.startswith("RIG_API_TOKENS: no token of any role is set")
        assert "\n" not in problem


def test_cli_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RIG_ENTRY_STALE_MS", "-1")
    assert cli.main(["reap", "--once"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        "rig-conductor: RIG_ENTRY_STALE_MS: Input should be greater than or equal to 0 (got '-1')"
    ]


def test_cli_runs_as_a_module_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_LOG_FORMAT", "yaml")
    done = subprocess.run(
        [sys.executable, "-m", "rig_conductor", "check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("rig-conductor: RIG_LOG_FORMAT:")


def test_sqlalchemy_url_uses_psycopg3() -> None:
    settings = Settings(database_url="postgresql://u:p%40ss@db:5432/rig")
    assert settings.sqlalchemy_url == "postgresql+psycopg://u:p%40ss@db:5432/rig"


def test_the_session_secret_is_optional_and_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIG_SESSION_SECRET", "   ")
    assert load_settings().session_secret is None
    secret = "s3cret-" * 6
    monkeypatch.setenv("RIG_SESSION_SECRET", secret)
    settings = load_settings()
    assert settings.session_secret is not None
    assert settings.session_secret.get_secret_value() == secret
    assert settings.describe()["RIG_SESSION_SECRET"] == "<hidden>"
    monkeypatch.setenv("RIG_SESSION_SECRET", secret[:20])
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert secret[:20] not in str(caught.value)
