"""The audit image (Dockerfile.audit), as `make release` archives it and the chart's CronJob runs
it: hardened (uid 10001, read-only root, no capabilities), `rig-conductor audit` reads the event
log over JDBC with its own Java and Debian's driver, and writes summary.json.

Building it takes minutes (PySpark, a JDK), so this tests the release's archive:
RIG_AUDIT_IMAGE_ARCHIVE=dist/rig-conductor-V-audit.oci.tar (CI sets it after `make release`).
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
AUDIT_IMAGE = "localhost/rig-conductor:test-audit"


@pytest.fixture(scope="module")
def audit_image() -> str:
    archive = os.environ.get("RIG_AUDIT_IMAGE_ARCHIVE")
    if not archive:
        needs.missing("RIG_AUDIT_IMAGE_ARCHIVE names no audit image archive (make release)")
    assert archive is not None and Path(archive).is_file(), f"{archive}: no such file"
    loaded = podman("pull", "--quiet", f"oci-archive:{Path(archive).resolve()}", timeout=600)
    podman("tag", loaded.stdout.strip().splitlines()[-1], AUDIT_IMAGE)
    return AUDIT_IMAGE


def test_the_audit_image_audits_hardened(
    audit_image: str, redis_url: str, database_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
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
    labels = json.loads(podman("image", "inspect", audit_image).stdout)[0]["Labels"]
    assert labels["org.opencontainers.image.version"] == __version__
