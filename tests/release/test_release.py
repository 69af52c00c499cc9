"""What `make release` left in dist/: SHA256SUMS holds for every artefact and names them all,
and every artefact carries the one version (scripts/version.py) and, for the images, the commit.

.ci/run runs it right after `make release`, as `make check-release`; without a dist/ it skips off
CI and fails on CI.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests import needs

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / "dist"
NPM = REPO / "clients" / "typescript" / "package.json"


def versions() -> ModuleType:
    spec = importlib.util.spec_from_file_location("version", REPO / "scripts" / "version.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VERSION: str = versions().version()


@pytest.fixture(scope="module")
def sums() -> dict[str, str]:
    """SHA256SUMS as file name -> digest."""
    listing = DIST / "SHA256SUMS"
    if not listing.exists():
        needs.missing("no dist/SHA256SUMS: run `make release` first")
    found = {}
    for line in listing.read_text().splitlines():
        digest, name = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups()  # type: ignore[union-attr]
        found[name] = digest
    return found


def expected() -> set[str]:
    names = {
        f"rig_conductor-{VERSION}-py3-none-any.whl",
        f"rig_conductor-{VERSION}.tar.gz",
        f"rig-conductor-{VERSION}.oci.tar",
        f"rig-conductor-{VERSION}-audit.oci.tar",
        f"rig-conductor-{VERSION}.tgz",
    }
    if NPM.exists():
        package = json.loads(NPM.read_text())
        names.add(f"{package['name'].lstrip('@').replace('/', '-')}-{VERSION}.tgz")
    return names


def test_sha256sums_names_every_artefact_and_holds(sums: dict[str, str]) -> None:
    on_disk = {p.name for p in DIST.iterdir() if p.is_file() and p.name != "SHA256SUMS"}
    assert set(sums) == on_disk, f"SHA256SUMS and dist/ differ: {sorted(set(sums) ^ on_disk)}"
    assert set(sums) == expected(), f"dist/ holds {sorted(sums)}, expected {sorted(expected())}"
    for name, digest in sums.items():
        with (DIST / name).open("rb") as f:
            assert hashlib.file_digest(f, "sha256").hexdigest() == digest, name


def metadata_version(text: str) -> str:
    found = re.search(r"^Version: (\S+)$", text, re.MULTILINE)
    assert found, text[:500]
    return found.group(1)


def test_the_wheel_and_the_sdist_carry_the_version_and_the_license(sums: dict[str, str]) -> None:
    with zipfile.ZipFile(DIST / f"rig_conductor-{VERSION}-py3-none-any.whl") as wheel:
        info = f"rig_conductor-{VERSION}.dist-info"
        assert metadata_version(wheel.read(f"{info}/METADATA").decode()) == VERSION
        assert b"Apache License" in wheel.read(f"{info}/licenses/LICENSE")
        init = wheel.read("rig_conductor/__init__.py").decode()
        assert f'__version__ = "{VERSION}"' in init
    with tarfile.open(DIST / f"rig_conductor-{VERSION}.tar.gz") as sdist:
        root = f"rig_conductor-{VERSION}"
        pkg_info = sdist.extractfile(f"{root}/PKG-INFO")
        assert pkg_info is not None and metadata_version(pkg_info.read().decode()) == VERSION
        assert f"{root}/LICENSE" in sdist.getnames()


def test_the_chart_carries_the_version(sums: dict[str, str]) -> None:
    with tarfile.open(DIST / f"rig-conductor-{VERSION}.tgz") as chart:
        member = chart.extractfile("rig-conductor/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(member.read())
    assert (meta["version"], str(meta["appVersion"])) == (VERSION, VERSION)


def image_config(archive: Path) -> tuple[str, dict[str, Any]]:
    """An OCI archive's reference name and its image configuration."""
    with tarfile.open(archive) as oci:

        def blob(descriptor: dict[str, Any]) -> Any:
            algorithm, digest = descriptor["digest"].split(":")
            member = oci.extractfile(f"blobs/{algorithm}/{digest}")
            assert member is not None
            return json.loads(member.read())

        index_file = oci.extractfile("index.json")
        assert index_file is not None
        (manifest,) = json.loads(index_file.read())["manifests"]
        ref = manifest.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        return ref, blob(blob(manifest)["config"])


@pytest.mark.parametrize("suffix", ["", "-audit"])
def test_the_images_carry_the_version_and_the_commit(sums: dict[str, str], suffix: str) -> None:
    ref, config = image_config(DIST / f"rig-conductor-{VERSION}{suffix}.oci.tar")
    assert ref == f"{VERSION}{suffix}"
    labels = config["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    revision = labels["org.opencontainers.image.revision"]
    assert re.fullmatch(r"[0-9a-f]{40}", revision), revision
    # What rig_build_info reports inside the image.
    assert f"RIG_BUILD_REVISION={revision}" in config["config"]["Env"]
    # Stamped with the commit's time (SOURCE_DATE_EPOCH), not the build's.
    committed = commit_time(revision)
    if committed is not None:
        when = datetime.fromtimestamp(int(committed), UTC)
        assert labels["org.opencontainers.image.created"] == when.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert config["created"].startswith(when.strftime("%Y-%m-%dT%H:%M:%S"))


def commit_time(revision: str) -> str | None:
    done = subprocess.run(
        ["git", "log", "-1", "--format=%ct", revision],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def test_the_wheel_rebuilds_byte_for_byte_from_the_sdist(
    sums: dict[str, str], tmp_path: Path
) -> None:
    """Reproducible: the sdist, built again into a wheel with the release's SOURCE_DATE_EPOCH
    (the time of the commit the images name), gives the same wheel."""
    _, config = image_config(DIST / f"rig-conductor-{VERSION}.oci.tar")
    epoch = commit_time(config["config"]["Labels"]["org.opencontainers.image.revision"])
    if epoch is None:
        pytest.skip("the release's commit is not in this clone: its time is unknown")
    with tarfile.open(DIST / f"rig_conductor-{VERSION}.tar.gz") as sdist:
        sdist.extractall(tmp_path, filter="data")
    rebuilt = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "wheel"),
         str(tmp_path / f"rig_conductor-{VERSION}")],
        capture_output=True, text=True, check=False, env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    with (tmp_path / "wheel" / f"rig_conductor-{VERSION}-py3-none-any.whl").open("rb") as f:
        assert (
            hashlib.file_digest(f, "sha256").hexdigest()
            == sums[f"rig_conductor-{VERSION}-py3-none-any.whl"]
        )


@pytest.mark.parametrize(
    "name",
    [
        f"rig_conductor-{VERSION}.tar.gz",
        f"rig-conductor-{VERSION}.tgz",
        f"rig-conductor-{VERSION}.oci.tar",
        f"rig-conductor-{VERSION}-audit.oci.tar",
    ],
)
def test_every_archive_is_stamped_with_the_commits_time(sums: dict[str, str], name: str) -> None:
    """What makes the archives the same bytes on a rebuild: every member carries the release's
    SOURCE_DATE_EPOCH and root's ownership (tar writes them in name order, and gzip leaves out
    its own time)."""
    _, config = image_config(DIST / f"rig-conductor-{VERSION}.oci.tar")
    epoch = commit_time(config["config"]["Labels"]["org.opencontainers.image.revision"])
    if epoch is None:
        pytest.skip("the release's commit is not in this clone: its time is unknown")
    with tarfile.open(DIST / name) as archive:
        members = archive.getmembers()
    assert {m.mtime for m in members} == {int(epoch)}
    assert {(m.uid, m.gid) for m in members} == {(0, 0)}
    if name.endswith("gz"):
        header = (DIST / name).read_bytes()[:10]
        assert header[4:8] == b"\0\0\0\0", "the gzip header carries a time"


def test_the_npm_package_carries_the_version(sums: dict[str, str]) -> None:
    chart = f"rig-conductor-{VERSION}.tgz"
    tarballs = [name for name in sums if name.endswith(".tgz") and name != chart]
    if not NPM.exists():
        assert tarballs == []
        return
    (name,) = tarballs
    with tarfile.open(DIST / name) as npm:
        member = npm.extractfile("package/package.json")
        assert member is not None
        assert json.loads(member.read())["version"] == VERSION
