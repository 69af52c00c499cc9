"""Who the chaos soak's agents are and how each is started: its seat (agent id, consumer group,
runtime, always degraded or not), the command line of its runtime (the Python `rig-conductor
agent` or the TypeScript `rig-agent` of clients/typescript, built), and, with `--agent-users`,
its own least-privilege Redis user.

- `--fleet mixed`: in every group, every other agent process (workers first, then the degraded
  ones) runs the TypeScript runtime, all of them reading with that group's one name.
- `--groups N`: N consumer groups read the one dispatch stream, each with a fleet of its own
  (agent ids `chaos-w0`..., then `chaos2-w0`...): each group must finish every issue once.
- `--agent-users`: the users are the lines `rig-conductor redis-acl --agent-id ...` prints,
  applied with a password each (`ACL SETUSER ... on >password`); agents connect with them
  (`redis://rig-agent-<id>:<password>@...`), the conductor and the soak as the default user.
  A Redis restarted empty would come back without them: they are saved to its aclfile
  (`ACL SAVE`) as an operator keeps users, and the restarted server loads them at start.
  Their selectors need Redis 7.

It judges nothing about the run.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("chaos")

FLEETS = ("python", "typescript", "mixed")
BENCH = Path(__file__).resolve().parent
TS_PACKAGE = BENCH.parent / "clients" / "typescript"
TS_HANDLER = BENCH / "chaos_handler.mjs"
BUILD = "cd clients/typescript && npm ci && npm run build"
FIRST_GROUP = "chaos"


class FleetError(RuntimeError):
    """The fleet asked for cannot run on this machine: one line for the operator."""


@dataclass(frozen=True)
class Seat:
    """One agent of the fleet: a SIGKILLed worker is replaced in its seat by a new pod."""

    agent_id: str
    group: str
    runtime: str  # "python" or "typescript"
    degraded: bool = False


def group_names(groups: int) -> list[str]:
    return [FIRST_GROUP, *(f"{FIRST_GROUP}{n}" for n in range(2, groups + 1))]


def seats(*, groups: int, agents: int, degraded: int, fleet: str) -> list[Seat]:
    """Each group's workers, then its always-degraded agents; a group's first `agents` seats are
    its workers. In a mixed fleet the runtimes alternate, Python first."""
    found = []
    for group in group_names(groups):
        names = [f"{group}-w{slot}" for slot in range(agents)]
        names += [f"{group}-degraded{n}" for n in range(degraded)]
        for index, agent_id in enumerate(names):
            typescript = fleet == "typescript" or (fleet == "mixed" and index % 2 == 1)
            runtime = "typescript" if typescript else "python"
            found.append(Seat(agent_id, group, runtime, degraded=index >= agents))
    return found


def typescript_command() -> list[str]:
    """`node clients/typescript/dist/bin.js`; FleetError naming the build command when the
    package is not built (or Node is missing), a warning when its build is older than src/."""
    node = shutil.which("node")
    if node is None:
        raise FleetError("--fleet typescript|mixed needs Node.js >= 20 (`node` is not on PATH)")
    bin_js, index_js = TS_PACKAGE / "dist" / "bin.js", TS_PACKAGE / "dist" / "index.js"
    for needed in (bin_js, index_js, TS_PACKAGE / "node_modules" / "ioredis"):
        if not needed.exists():
            raise FleetError(
                f"the TypeScript runtime is not built ({needed.relative_to(BENCH.parent)} is "
                f"missing): run `{BUILD}` first"
            )
    sources = list((TS_PACKAGE / "src").glob("*.ts"))
    if sources and max(p.stat().st_mtime for p in sources) > index_js.stat().st_mtime:
        logger.warning("clients/typescript/src is newer than its dist/: run `%s` again", BUILD)
    return [node, str(bin_js)]


def agent_command(seat: Seat, *, stream: str, typescript: Sequence[str]) -> list[str]:
    """The argv of an agent process in `seat` (`typescript`: `typescript_command()`)."""
    where = ["--agent-id", seat.agent_id, "--group", seat.group, "--stream", stream]
    if seat.runtime == "typescript":
        return [*typescript, *where, "--handler", f"{TS_HANDLER}#handle"]
    return [sys.executable, "-m", "rig_conductor", "agent", *where, "--handler", "chaos:handle"]


def check_agent_users() -> None:
    """FleetError unless the private Redis (the machine's redis-server) is 7 or newer."""
    import private_servers

    version = private_servers.redis_server_version()
    if version < (7,):
        shown = ".".join(map(str, version))
        raise FleetError(
            f"--agent-users needs Redis 7 or newer (the agents' users keep their own keys in an "
            f"ACL selector); this machine's redis-server is {shown}"
        )


def setuser_lines(agent_ids: Sequence[str], *, stream: str) -> list[str]:
    """What `rig-conductor redis-acl` prints for these agents on this stream (their lines only:
    the conductor keeps the default user)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
    environment |= {"RIG_STREAMS": stream, "RIG_DISPATCH_STREAM": stream}
    argv = [sys.executable, "-m", "rig_conductor", "redis-acl"]
    for agent_id in agent_ids:
        argv += ["--agent-id", agent_id]
    done = subprocess.run(
        argv, env=environment, capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise FleetError(f"rig-conductor redis-acl exited {done.returncode}: {done.stderr[-500:]}")
    return [line for line in done.stdout.splitlines() if line.startswith("ACL SETUSER rig-agent-")]


async def apply_agent_users(redis: Any, agent_ids: Sequence[str], *, stream: str) -> dict[str, str]:
    """Each agent's user, with a password of its own, applied and saved to the aclfile; the
    users' names and passwords (user -> password)."""
    passwords: dict[str, str] = {}
    for line in setuser_lines(agent_ids, stream=stream):
        words = line.split()  # Redis 7 joins a selector's words back: `(~key +get ...)`
        user, password = words[2], secrets.token_hex(16)
        await redis.execute_command(*words, "on", f">{password}")
        passwords[user] = password
    missing = {f"rig-agent-{agent_id}" for agent_id in agent_ids} - set(passwords)
    if missing:
        raise FleetError(f"rig-conductor redis-acl printed no user for {sorted(missing)}")
    await redis.execute_command("ACL", "SAVE")
    return passwords


def user_url(redis_url: str, user: str, password: str) -> str:
    """`redis://host:port/db` as `user` (the names and passwords need no quoting)."""
    scheme, rest = redis_url.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


async def users_connected(redis: Any) -> set[str]:
    """The users other than `default` that clients are connected as now (CLIENT LIST)."""
    return {c["user"] for c in await redis.client_list() if c.get("user", "default") != "default"}
