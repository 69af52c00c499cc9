"""How the image is run hardened: one source for the image smoke test (tests/image) and the
chart test that the Deployment's container spec asks for the same (tests/chart)."""

from __future__ import annotations

IMAGE_REPOSITORY, IMAGE_TAG = "localhost/rig-conductor", "test"
IMAGE = f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"
USER = GROUP = 10001
HTTP_PORT = 8080
LIVENESS_PATH, READINESS_PATH = "/healthz", "/readyz"
# `podman run` options of the smoke test: read-only root, no capabilities, the non-root user.
HARDENED = ["--network", "host", "--read-only", "--cap-drop=all", "--user", f"{USER}:{GROUP}"]
