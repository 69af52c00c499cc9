"""The images as `make release` archives them (dist/*.oci.tar), loaded the way a registry user
gets them: each runs hardened (uid 10001, read-only root, no capabilities) and says its version;
the audit image (Dockerfile.audit), as the chart's CronJob runs it, audits: `rig-conductor audit`
reads the event log over JDBC with its own Java and Debian's driver and writes summary.json.

CI sets RIG_RELEASE_DIR=dist after `make release`; without it this skips (fails with CI set).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from rig_conductor import __version__
from tests import needs
from tests.image.hardening import HARDENED
from tests.image.test_image import podman

pytestmark = pytest.mark.timeout(900)


def loaded(suffix: str) -> str:
    """The release's archive of the image `rig-conductor:<version><suffix>`, pulled into the
    local storage; its local name."""
    release = os.environ.get("RIG_RELEASE_DIR")
    if not release:
        needs.missing("RIG_RELEASE_DIR names no release directory (make release: dist)")
    assert release is not None
    archive = Path(release) / f"rig-conductor-{__version__}{suffix}.oci.tar"
    assert archive.is_file(), f"{archive}: no such file"
    pulled = podman("pull", "--quiet", f"oci-archive:{archive.resolve()}", timeout=600)
    name = f"localhost/rig-conductor:release{suffix}"
    podman("tag", pulled.stdout.strip().splitlines()[-1], name)
    return name


@pytest.fixture(scope="module")
def audit_image() -> str:
    return loaded("-audit")


@pytest.mark.parametrize("suffix", ["", "-audit"])
def test_each_archived_image_runs_hardened_and_says_its_version(suffix: str) -> None:
    image = loaded(suffix)
    done = podman("run", "--rm", *HARDENED, image, "--version")
    assert done.stdout.strip() == f"rig-conductor {__version__}"
    labels = json.loads(podman("image", "inspect", image).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__


def test_the_audit_image_audits_hardened(
    audit_image: str, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the container's uid 10001 writes here
    env = {"RIG_REDIS_URL": redis_url, "RIG_DATABASE_URL": database_url, "HOME": "/tmp"}
    done = podman(
        "run", "--rm", "--name", f"rig-audit-{uuid.uuid4().hex[:8]}", *HARDENED,
        "--tmpfs", "/tmp:rw,size=1g,mode=1777", "--volume", f"{out}:/out",
        *[arg for name, value in env.items() for arg in ("--env", f"{name}={value}")],
        audit_image, "audit", "--output", "/out/latest",
        check=False, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "latest" / "summary.json").read_text())
    assert {"dispatched", "completed", "lost", "duplicates"} <= set(summary)
