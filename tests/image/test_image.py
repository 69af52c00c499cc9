"""The container image, built from the Dockerfile and run as a cluster would run it.

`scripts/build-image.sh` builds it without a Docker daemon (buildah, a cached mmdebstrap base).
Every container runs as uid 10001 with a read-only root filesystem and no capabilities, on the
host's network, against the real Redis and PostgreSQL: migrate, serve until /readyz, a
heartbeat, a dispatch, a dry-run scan, the image's HEALTHCHECK, and SIGTERM with exit 0. Then
the core loop: agent processes on the host, one SIGKILLed while it holds entries, and the
conductor in the container reclaims them for the survivor.

Slow (an image build), so `make test-image` runs it, in .ci/run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor import __version__
from tests import needs
from tests.e2e.fleet import Fleet, accepted_completions, dispatch, heard_from, pending
from tests.image.hardening import HARDENED, IMAGE, READINESS_PATH
from tests.integration.helpers import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
CACHE = os.environ.get("RIG_IMAGE_CACHE", "/var/cache/rig-conductor")

pytestmark = pytest.mark.timeout(900)
if shutil.which("buildah") is None or shutil.which("podman") is None:
    needs.missing("needs Debian's buildah and podman (.ci/run installs them)", module=True)


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONTAINERS_CONF": f"{CACHE}/containers.conf"}
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check:
        assert done.returncode == 0, f"podman {args[0]}: {done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def image() -> str:
    """The image under test: RIG_TEST_IMAGE when it names one already built (CI: the one `make
    release` built and archived, not built a second time), else a fresh build. Not the OCI
    archive itself: an OCI image has no HEALTHCHECK, which this test runs."""
    built_already = os.environ.get("RIG_TEST_IMAGE")
    if built_already:
        podman("tag", built_already, IMAGE)
        return IMAGE
    built = subprocess.run(
        [str(REPO / "scripts" / "build-image.sh"), IMAGE],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return IMAGE


def settings(redis_url: str, database_url: str, port: int, **extra: str) -> list[str]:
    env = {
        "RIG_REDIS_URL": redis_url,
        "RIG_DATABASE_URL": database_url,
        "RIG_HTTP_HOST": "127.0.0.1",
        "RIG_HTTP_PORT": str(port),
        "RIG_K8S_ENABLED": "false",
        "RIG_ALLOW_ANONYMOUS": "true",
        **extra,
    }
    return [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]


@pytest.fixture
def conductor(
    image: str, redis_url: str, database_url: str, request: pytest.FixtureRequest
) -> Iterator[tuple[str, str, float]]:
    """`serve` in a hardened container: (name, base URL, seconds to ready)."""
    port, name = free_port(), f"rig-test-{uuid.uuid4().hex[:8]}"
    extra: dict[str, str] = getattr(request, "param", {})
    env = settings(redis_url, database_url, port, **extra)
    migrated = podman("run", "--rm", *HARDENED, *env, image, "migrate", timeout=180)
    assert migrated.returncode == 0
    started = time.monotonic()
    podman("run", "--detach", "--name", name, *HARDENED, *env, image)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}{READINESS_PATH}").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            logs = podman("logs", name, check=False)
            pytest.fail(f"not ready within 60 s: {logs.stderr[-3000:]}")
        yield name, url, time.monotonic() - started
    finally:
        podman("rm", "--force", "--time", "5", name, check=False)


def test_the_image_serves_hardened_and_stops_cleanly(
    conductor: tuple[str, str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    name, url, ready_s = conductor
    with httpx.Client(base_url=url) as api:
        beat = api.post("/api/events", json={"type": "HEARTBEAT", "agentId": "dev-e"})
        assert beat.status_code == 202
        # A fresh issue id: the Redis database may hold earlier tests' dispatch markers.
        issue_id = f"rc-{uuid.uuid4().hex[:8]}"
        issue = {"type": "ISSUE_ASSIGNED", "issueId": issue_id, "agentId": "dev-e", "payload": {}}
        assert api.post("/api/events", json=issue).status_code == 201
        scan = api.post("/api/reaper/scan", params={"dryRun": "true"})
        assert scan.status_code == 200 and scan.json()["dryRun"] is True
        metrics = api.get("/metrics")
        assert metrics.status_code == 200
    # rig_build_info names the version and the commit the image's labels name.
    labels = json.loads(podman("image", "inspect", IMAGE).stdout)[0]["Labels"]
    build_info = (
        f'rig_build_info{{revision="{labels["org.opencontainers.image.revision"]}",'
        f'version="{labels["org.opencontainers.image.version"]}"}} 1.0'
    )
    assert build_info in metrics.text.splitlines(), metrics.text[:2000]
    assert labels["org.opencontainers.image.version"] == __version__
    health = podman("healthcheck", "run", name, check=False)
    assert health.returncode == 0, health.stderr
    inspect = json.loads(podman("image", "inspect", IMAGE).stdout)[0]
    size_mb = inspect["Size"] / 1e6
    podman("stop", "--time", "30", name, timeout=60)
    state = json.loads(podman("inspect", name).stdout)[0]["State"]
    assert state["ExitCode"] == 0, podman("logs", name, check=False).stderr[-3000:]
    with capsys.disabled():
        print(f"\nimage {IMAGE}: {size_mb:.0f} MB, ready {ready_s:.1f} s after start")


FAST = {
    "RIG_STREAMS": "rig:dispatch",
    "RIG_AGENT_IDS": "builder-a,builder-b",
    "RIG_ENTRY_STALE_MS": "500",
    "RIG_AGENT_DOWN_MS": "2000",
    "RIG_SCAN_INTERVAL_S": "0.5",
    "RIG_STARTUP_DELAY_S": "0",
}


@pytest.mark.parametrize("conductor", [FAST], indirect=True)
async def test_a_killed_agents_entries_are_reclaimed_by_the_containerised_conductor(
    conductor: tuple[str, str, float],
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    tmp_path: Path,
) -> None:
    _, url, _ = conductor
    hold = tmp_path / "hold"
    hold.touch()
    env = {"E2E_OUT_DIR": str(tmp_path / "out")}
    async with httpx.AsyncClient(base_url=url) as api:
        with Fleet(redis_url, url, tmp_path, env) as fleet:
            victim = fleet.start("builder-b", "builder-b-pod-0", E2E_HOLD_FILE=str(hold))
            await wait_for(lambda: heard_from(api, victim.consumer), within=30)
            entries = [await dispatch(api, f"rc-{n}", {}) for n in range(3)]
            await wait_for(lambda: (tmp_path / "out" / f"holding-{victim.consumer}").exists())
            victim.kill()
            survivor = fleet.start("builder-a", "builder-a-pod-0")

            async def done() -> bool:
                completed = await accepted_completions(engine)
                return set(entries) <= set(completed) and not await pending(redis)

            await wait_for(done, within=60)
            fleet.stop_all()
    completions = await accepted_completions(engine)
    assert {completions[e][0].consumer for e in entries} == {survivor.consumer}
