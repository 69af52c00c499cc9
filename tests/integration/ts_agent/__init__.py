"""Running the TypeScript agent in tests: the package built (and packed, and installed as a user
installs it) once a session, `rig-agent` processes in a `Fleet`, and the checks its tests share.

The package is built once a test run, whichever pytest-xdist worker gets there first.
`installed` packs it into a tarball of its own, so `npm pack` never rebuilds `dist/` under
running agents: `--ignore-scripts` skips the `prepack` build."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.fleet import (
    GROUP,
    STREAM,
    AgentProcess,
    Completion,
    Fleet,
    accepted_completions,
    effects,
    pending,
    spawn,
    staged_leftovers,
)
from tests.needs import missing

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "clients" / "typescript"
HANDLER = Path(__file__).resolve().parent / "handler.mjs"
WITHIN = 90.0  # a loaded two-core machine: generous bounds, conditions waited on


@pytest.fixture(scope="session", name="rig_agent")
def rig_agent_fixture() -> Iterator[list[str]]:
    """The command that runs the TypeScript agent, built once a test run with `npm ci` and
    `npm run build`, as a user builds the package.

    pytest-xdist workers of one run share the build: the first builds under a lock and leaves a
    stamp with the run's id; the others find it and build nothing (a second `npm ci` would
    delete node_modules under agents that run from it)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing("node and npm are needed to build and run the TypeScript agent")
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"
    with (PACKAGE / ".build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = PACKAGE / "dist" / ".built-by-test-run"
        if not (stamp.is_file() and stamp.read_text() == run):
            for step in (["ci", "--no-audit", "--no-fund"], ["run", "build"]):
                done = subprocess.run(
                    [npm, *step],
                    cwd=PACKAGE,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                assert done.returncode == 0, (
                    f"npm {' '.join(step)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
                )
            stamp.write_text(run)
    yield [node, str(PACKAGE / "dist" / "bin.js")]


@pytest.fixture(scope="session", name="installed")
def installed_fixture(rig_agent: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty folder where the packed tarball was installed as the README says
    (`npm install ./rig-conductor-agent-0.2.0.tgz`), with the README's handler module in it."""
    npm = shutil.which("npm")
    assert npm is not None
    where = tmp_path_factory.mktemp("ts-install")
    packed = subprocess.run(
        [npm, "pack", "--ignore-scripts", "--pack-destination", str(where)],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert packed.returncode == 0, packed.stderr[-2000:]
    tarball = where / "rig-conductor-agent-0.2.0.tgz"
    assert tarball.is_file(), sorted(p.name for p in where.iterdir())
    app = where / "app"
    app.mkdir()
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", str(tarball)],
        cwd=app,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    readme = (PACKAGE / "README.md").read_text()
    example = re.search(r"```js\n(// handler\.mjs.*?)```", readme, re.DOTALL)
    assert example is not None, "the README's handler.mjs example"
    (app / "handler.mjs").write_text(example.group(1))
    return app


def start_ts(
    fleet: Fleet,
    command: list[str],
    agent_id: str,
    consumer: str,
    *,
    handler: str | None = None,
    cwd: Path | None = None,
    log_name: str | None = None,
    **env: str,
) -> AgentProcess:
    """A `rig-agent` process in `fleet` (reaped with it), as `Fleet.start` starts Python ones."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment.update(
        {
            "RIG_REDIS_URL": fleet.redis_url,
            "RIG_CONDUCTOR_URL": fleet.conductor_url,
            "RIG_HEARTBEAT_INTERVAL_S": "0.5",
            "RIG_SCAN_INTERVAL_S": "1",
            "CONSUMER_ID": consumer,
        }
        | fleet.env
        | env
    )
    # `log_name`: for a second process of one consumer name, which must not share the first's log.
    log = fleet.workdir / "logs" / f"{log_name or consumer}.log"
    argv = [*command, "--agent-id", agent_id, "--group", GROUP, "--stream", STREAM]
    argv += ["--handler", handler or f"{HANDLER}#build"]
    agent = spawn(agent_id, consumer, argv, cwd=cwd or fleet.workdir, env=environment, log=log)
    fleet.agents.append(agent)
    return agent


async def settled(engine: AsyncEngine, redis: Redis, entries: set[str]) -> bool:
    """Every one of `entries` completed, and nothing left pending."""
    done = await accepted_completions(engine)
    return entries <= set(done) and not await pending(redis)


def assert_published_once(
    out: Path, engine_completions: dict[str, list[Completion]], issues: dict[str, str]
) -> None:
    assert sorted(effects(out)) == sorted(issues)
    for issue, entry in issues.items():
        assert len(engine_completions[entry]) == 1, (issue, engine_completions[entry])
        effect = effects(out)[issue]
        assert effect["entryId"] == entry
    assert staged_leftovers(out) == []
