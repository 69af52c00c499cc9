"""`pip install rig-conductor` with no extras, as a new user does, then the commands they run.

The wheel is built from this checkout and installed into a fresh venv with only its declared
dependencies (and constraints.txt, the versions CI and the image use). Every module that does
not belong to an extra must import there, and the commands must work against the real Redis and
PostgreSQL. Then `[audit]` is added and `audit --help` must work. A runtime import missing from
the dependencies fails here, not on a platform team's first `helm install`.

Slow (a venv and a download of the dependencies), so `make test-install` runs it, in .ci/run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
# Modules that need an extra: embedded servers ([embedded]) and the audit ([audit]).
EXTRA_ONLY = ("rig_conductor.embedded", "rig_conductor.audit")
# Alembic loads these itself, inside a migration run.
NOT_IMPORTABLE = ("rig_conductor._migrations",)

pytestmark = pytest.mark.timeout(900)


def pip(venv: Path, *args: str) -> None:
    constraints = REPO / "constraints.txt"
    extra = ["--constraint", str(constraints)] if constraints.is_file() else []
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *extra, *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("plain")
    wheels = work / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("rig_conductor-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip(venv, str(wheel))
    yield venv


def command(
    venv: Path, *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RIG_", "PYTHONPATH"))}
    return subprocess.run(
        [str(venv / "bin" / "rig-conductor"), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=venv,  # not the checkout: nothing may come from the source tree
        check=False,
    )


def python(venv: Path, script: str) -> subprocess.CompletedProcess[str]:
    """`script` run by the venv's Python, outside the checkout."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        capture_output=True,
        text=True,
        cwd=venv,
        check=False,
    )


@pytest.fixture
def env(redis_url: str, database_url: str) -> dict[str, str]:
    return {
        "RIG_REDIS_URL": redis_url,
        "RIG_DATABASE_URL": database_url,
        "RIG_STREAMS": "rig:dispatch",
        "RIG_K8S_ENABLED": "false",
        "RIG_ALLOW_ANONYMOUS": "true",
    }


def test_every_module_outside_the_extras_imports(venv: Path) -> None:
    script = (
        "import importlib, pkgutil, rig_conductor\n"
        f"skip = {EXTRA_ONLY + NOT_IMPORTABLE!r}\n"
        "for m in pkgutil.walk_packages(rig_conductor.__path__, 'rig_conductor.'):\n"
        "    if not (m.name.startswith(skip) or m.name.endswith('__main__')):\n"
        "        importlib.import_module(m.name)\n"
        "print('ok')\n"
    )
    done = python(venv, script)
    assert done.stdout.strip() == "ok", done.stderr[-3000:]


def test_help(venv: Path) -> None:
    for args in (("--help",), ("agent", "--help"), ("serve", "--help")):
        done = command(venv, *args, env={})
        assert done.returncode == 0, done.stderr[-3000:]
        assert "usage: rig-conductor" in done.stdout


def test_migrate_check_and_reap(venv: Path, env: dict[str, str]) -> None:
    for args in (("migrate",), ("check",)):
        done = command(venv, *args, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    reaped = command(venv, "reap", "--once", env=env)
    assert reaped.returncode == 0, reaped.stderr[-3000:]
    assert json.loads(reaped.stdout)["dryRun"] is False


def test_serve_gets_ready_and_stops_on_sigterm(venv: Path, env: dict[str, str]) -> None:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RIG_", "PYTHONPATH"))}
    serving = subprocess.Popen(
        [str(venv / "bin" / "rig-conductor"), "serve"],
        env={**clean, **env, "RIG_HTTP_HOST": "127.0.0.1", "RIG_HTTP_PORT": str(port)},
        cwd=venv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        ready = False
        while time.monotonic() < deadline and serving.poll() is None and not ready:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
            except httpx.TransportError:
                time.sleep(0.2)
        assert ready, f"not ready: exit {serving.poll()}"
        # The console ships in the wheel: its templates, its script and the vendored libraries.
        base = f"http://127.0.0.1:{port}/ui"
        login = httpx.get(f"{base}/login", follow_redirects=True)
        assert login.status_code == 200 and "<html" in login.text, login.text[:500]
        for asset in ("console.js", "console.css", "vendor/htmx-2.0.11.min.js"):
            assert httpx.get(f"{base}/static/{asset}").status_code == 200, asset
        serving.send_signal(signal.SIGTERM)
        _, stderr = serving.communicate(timeout=60)
        assert serving.returncode == 0, stderr[-3000:]
    finally:
        if serving.poll() is None:
            serving.kill()
            serving.communicate()


def test_the_audit_extra_adds_the_audit(venv: Path) -> None:
    [wheel] = (venv.parent / "wheels").glob("rig_conductor-*.whl")
    pip(venv, f"{wheel}[audit]")
    done = command(venv, "audit", "--help", env={})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--output" in done.stdout
    # report.html's template ships in the wheel, beside the module that renders it.
    page = "resources.files('rig_conductor.audit').joinpath('templates/report.html')"
    done = python(venv, f"from importlib import resources; print({page}.is_file())")
    assert done.stdout.strip() == "True", done.stderr[-3000:]
