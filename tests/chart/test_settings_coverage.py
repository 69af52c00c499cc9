"""Every setting can be set from the chart, secrets only from a Secret, and an upgrade from the
previous release's values still renders.

- Every `RIG_*` field of the conductor's settings class reaches the container's environment from
  some value (with every optional part of the chart on), or values.yaml names it, with a reason,
  among those left to `extraEnv`.
- Every secret setting (the fields the settings never echo: URLs with credentials, every kind of
  token, the session key) is a `secretKeyRef`, never a literal value, whether the Secret is the
  chart's own or an `existingSecret`.
- The previous release's values (the chart at `PREVIOUS`) render with this chart, both as an
  upgrade that passes them again (`-f`) and as `helm upgrade --reuse-values` of old Helm
  versions, which keep the old chart's defaults and drop the new ones.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rig_conductor import settings as conductor_settings
from tests import needs
from tests.chart.conftest import (
    ALL_FEATURES,
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    REPO,
    TESTDATA,
    Render,
    Tools,
)

# The release before this one (0.1.0); its chart's values must keep rendering.
PREVIOUS = "63a7d06"
VALUES = CHART / "values.yaml"
# "#   RIG_NAME: reason" lines in values.yaml: settings left to extraEnv on purpose.
_LEFT_OUT = re.compile(r"^#\s+(RIG_[A-Z0-9_]+):\s*(\S.*)$", re.MULTILINE)


def setting_names() -> dict[str, str]:
    """Every RIG_* variable of the conductor's settings, by field name."""
    prefix = conductor_settings.ENV_PREFIX
    return {field: prefix + field.upper() for field in conductor_settings.Settings.model_fields}


def secret_names() -> set[str]:
    """The settings that hold credentials: the ones the settings never echo back, and any
    field named like a token, a secret or a password (so a new kind cannot slip past)."""
    fields = setting_names()
    secret = set(conductor_settings._SECRET_FIELDS)
    secret |= {f for f in fields if re.search(r"(token|secret|password)s?$", f)}
    secret -= {"k8s_token_audience"}  # an audience name, not a credential
    return {fields[f] for f in secret}


def left_to_extra_env() -> dict[str, str]:
    return dict(_LEFT_OUT.findall(VALUES.read_text()))


def containers(rendered: Path) -> list[tuple[str, dict[str, Any]]]:
    """The conductor's containers: the Deployment's and the migration Job's."""
    docs = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    found = []
    for doc in docs:
        if doc["kind"] == "Deployment" or (
            doc["kind"] == "Job" and doc["metadata"]["name"].endswith("-migrate")
        ):
            found.append((doc["kind"], doc["spec"]["template"]["spec"]["containers"][0]))
    assert len(found) == 2, [kind for kind, _ in found]
    return found


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def test_every_setting_has_a_chart_value_or_a_documented_reason(render: Render) -> None:
    left = left_to_extra_env()
    unknown = set(left) - set(setting_names().values())
    assert not unknown, f"values.yaml leaves to extraEnv what is no setting: {sorted(unknown)}"
    for kind, container in containers(render("-f", ALL_FEATURES)):
        rendered = set(env_of(container))
        missing = sorted(set(setting_names().values()) - rendered - set(left))
        assert not missing, (
            f"{kind}: no chart value sets {missing}: add one to values.yaml (and the env in "
            "_helpers.tpl), or list it in values.yaml as '#   RIG_NAME: reason' to leave it "
            "to extraEnv"
        )


@pytest.mark.parametrize(
    "values", [("-f", ALL_FEATURES), ("-f", TESTDATA / "chart-secret-values.yaml")]
)
def test_every_secret_comes_from_a_secret(render: Render, values: tuple[str, Path]) -> None:
    secrets = secret_names()
    assert {"RIG_AGENT_TOKENS", "RIG_API_TOKENS", "RIG_SESSION_SECRET"} <= secrets
    for kind, container in containers(render(*values)):
        env = env_of(container)
        for name in sorted(secrets):
            assert name in env, f"{kind}: {name} not set from the chart"
            assert "value" not in env[name], f"{kind}: {name} is a literal value"
            assert env[name]["valueFrom"]["secretKeyRef"]["key"], f"{kind}: {name}"


def test_bound_agent_tokens_go_into_the_charts_secret(render: Render) -> None:
    docs = yaml.safe_load_all(render("-f", TESTDATA / "chart-secret-values.yaml").read_text())
    secrets = [d for d in docs if d and d["kind"] == "Secret"]
    assert secrets and all("RIG_AGENT_TOKENS" in s["data"] for s in secrets)


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ("agent-a:short", "at least 16 characters"),
        ("no-agent-named-0123456789", "<agentId>:<token>"),
        (":0123456789abcdef0123", "<agentId>:<token>"),
    ],
)
def test_bad_bound_agent_tokens_fail_the_render(tools: Tools, tokens: str, problem: str) -> None:
    done = subprocess.run(
        [str(tools.helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--set-string", f"secrets.agentTokens={tokens}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and problem in done.stderr, done.stderr


def previous(path: str) -> str:
    done = subprocess.run(
        ["git", "show", f"{PREVIOUS}:{path}"], capture_output=True, text=True, check=False, cwd=REPO
    )
    if done.returncode != 0:
        needs.missing(f"the previous release {PREVIOUS} is not in this clone's history")
    return done.stdout


@pytest.mark.parametrize(
    "values",
    ["charts/rig-conductor/values.yaml", "charts/rig-conductor/ci/all-features-values.yaml"],
)
def test_the_previous_releases_values_render_on_upgrade(
    render: Render, tmp_path: Path, values: str
) -> None:
    old = tmp_path / "previous-values.yaml"
    old.write_text(previous(values))
    for kind, container in containers(render("-f", old, name="upgrade")):
        env = env_of(container)
        assert env["RIG_AGENT_FORGET_MS"]["value"] == "604800000", kind
        # Not referenced unless named: the previous release's Secrets have no such key.
        assert "RIG_AGENT_TOKENS" not in env, kind


def test_reuse_values_of_the_previous_release_render(tools: Tools, tmp_path: Path) -> None:
    """Old Helm's `upgrade --reuse-values` hands the new templates the previous release's values
    only: the new chart's own defaults are missing, and must be defaulted in the templates."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "values.yaml").write_text(previous("charts/rig-conductor/values.yaml"))
    done = subprocess.run(
        [str(tools.helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE,
         "--kube-version", KUBE_VERSIONS[0]],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered = tmp_path / "reused.yaml"
    rendered.write_text(done.stdout)
    for kind, container in containers(rendered):
        assert env_of(container)["RIG_AGENT_FORGET_MS"]["value"] == "604800000", kind
