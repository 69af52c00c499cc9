"""The chart's tools and renders: real helm, kubernetes-validate, hadolint and checkov fetched by
scripts/fetch-tools.sh into .cache/tools, promtool from Debian's prometheus package."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.audit_conftest import unavailable

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rig-conductor"
ALL_FEATURES = CHART / "ci" / "all-features-values.yaml"
TESTDATA = REPO / "tests" / "chart"
RULES = CHART / "files" / "prometheus-rules.yaml"
RULE_TESTS = REPO / "tests" / "prometheus" / "rules.test.yaml"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
# The newest Kubernetes release kubernetes-validate knows, and the oldest the chart supports.
KUBE_VERSIONS = ("1.37.0", "1.25.0")
RELEASE, NAMESPACE = "rig", "rig-system"
FULLNAME = "rig-rig-conductor"  # fullname of RELEASE with the default values


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/chart/" in str(item.path):
            item.add_marker(pytest.mark.timeout(300))


@dataclass(frozen=True)
class Tools:
    helm: Path
    kubernetes_validate: Path
    hadolint: Path
    checkov: Path
    promtool: Path | None

    def need_promtool(self) -> Path:
        if self.promtool is None:
            unavailable("promtool not found: install Debian's prometheus package")
        assert self.promtool is not None
        return self.promtool


@pytest.fixture(scope="session")
def tools() -> Tools:
    subprocess.run(["bash", str(REPO / "scripts" / "fetch-tools.sh")], check=True, cwd=REPO)
    root = REPO / ".cache" / "tools"
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    return Tools(
        helm=root / "bin" / "helm",
        kubernetes_validate=root / "venv" / "bin" / "kubernetes-validate",
        hadolint=root / "venv" / "bin" / "hadolint",
        checkov=root / "checkov" / "bin" / "checkov",
        promtool=Path(promtool) if promtool else None,
    )


Render = Callable[..., Path]


@pytest.fixture
def render(tools: Tools, tmp_path: Path) -> Render:
    """`helm template` of the chart with extra arguments, into a file of its own."""

    def run(*args: str | Path, name: str = "rendered") -> Path:
        out = tmp_path / f"{name}.yaml"
        command = [str(tools.helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        command += ["--kube-version", KUBE_VERSIONS[0], *map(str, args)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPO)
        assert done.returncode == 0, done.stderr
        out.write_text(done.stdout)
        return out

    return run


def helm_lint(tools: Tools, *args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [str(tools.helm), "lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    return subprocess.run(
        [*command, *map(str, args)], capture_output=True, text=True, check=False, cwd=REPO
    )
