"""One version, from one place: `rig_conductor.__version__`. The wheel's metadata, the CLI, the
chart, the images' labels, the npm package and the `rig_build_info` gauge all say it
(scripts/version.py lists the places; a release's artefacts are checked by
tests/release/test_release.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
from prometheus_client import generate_latest

from rig_conductor import __version__, build, cli
from rig_conductor.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]


def versions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("version", REPO / "scripts" / "version.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_place_says_the_one_version() -> None:
    module = versions()
    assert module.version() == __version__
    assert module.mismatches() == []
    assert {"Chart.yaml version", "Chart.yaml appVersion", "Dockerfile ARG VERSION"} <= set(
        module.places()
    )


def test_a_place_that_disagrees_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = versions()
    chart = tmp_path / "Chart.yaml"
    chart.write_text(
        module.CHART.read_text().replace(f'appVersion: "{__version__}"', 'appVersion: "9.9.9"')
    )
    monkeypatch.setattr(module, "CHART", chart)
    assert module.mismatches() == [f"Chart.yaml appVersion: '9.9.9' (want '{__version__}')"]


def test_the_npm_package_is_checked_once_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = versions()
    package = tmp_path / "package.json"
    monkeypatch.setattr(module, "NPM", package)
    package.write_text(json.dumps({"name": "@rig/agent", "version": "0.0.1"}))
    assert module.mismatches() == [
        f"clients/typescript/package.json: '0.0.1' (want '{__version__}')"
    ]
    package.write_text(json.dumps({"name": "@rig/agent", "version": __version__}))
    assert module.mismatches() == []


def test_the_installed_distribution_has_the_version() -> None:
    assert importlib.metadata.version("rig-conductor") == __version__


def test_the_cli_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"rig-conductor {__version__}"


def test_build_info_is_exposed_from_start_up() -> None:
    text = generate_latest(Metrics().registry).decode()
    line = f'rig_build_info{{revision="{build.revision()}",version="{__version__}"}} 1.0'
    assert line in text.splitlines()


def test_the_revision_comes_from_the_build_else_from_git(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build.revision.cache_clear()
    monkeypatch.setenv(build.REVISION_ENV, "0123abc")
    assert build.revision() == "0123abc"
    build.revision.cache_clear()
    monkeypatch.delenv(build.REVISION_ENV)
    git = shutil.which("git")
    if git is not None and (REPO / ".git").exists():
        head = subprocess.run(
            [git, "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        assert build.revision() == head
    build.revision.cache_clear()
    monkeypatch.setattr(build, "_CHECKOUT", REPO / "nowhere")
    assert build.revision() == build.UNKNOWN
    build.revision.cache_clear()
