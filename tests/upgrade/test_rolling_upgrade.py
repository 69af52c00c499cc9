"""A rolling upgrade from the previous release (N-1) to this one (N), with real processes on one
PostgreSQL and one Redis, as the contract's "Releases and upgrades" describes it:

1. N-1 migrates a fresh database and serves; agents of N-1 work through a proxy that stands for
   the Service, while a dispatcher keeps dispatching through it.
2. `migrate` of N runs while N-1 serves; then N serves beside N-1 and the proxy shares the
   requests between them; an agent of N joins the agents of N-1.
3. N-1 leaves the rotation and is stopped (SIGTERM); N serves alone.

Then: every dispatched issue was done exactly once (one handler call, one accepted completion,
nothing pending), no request through the proxy was answered 5xx or not at all, N-1 stopped
cleanly, and the two replicas never held the reaper's lease at the same time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.e2e.fleet import (
    GROUP,
    STREAM,
    accepted_completions,
    calls,
    conductor_env,
    effects,
    heard_from,
    pending,
)
from tests.integration.helpers import free_port, fresh_database, wait_for
from tests.upgrade.previous import CURRENT, Process, Release, previous_release, run, start
from tests.upgrade.proxy import Proxy, running_proxy

pytestmark = pytest.mark.timeout(900)

AGENTS = ["builder-a", "builder-b", "builder-c"]
HANDLER = "tests.e2e.handlers:build"


@pytest.fixture(scope="module")
def previous() -> Release:
    return previous_release()


@pytest.fixture
def empty_database(database_url: str) -> Iterator[str]:
    """A database of its own, with no schema: the previous release migrates it."""
    with fresh_database(database_url, "rig_upgrade") as url:
        yield url


@pytest.fixture
async def upgrade_engine(empty_database: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(make_url(empty_database).set(drivername="postgresql+psycopg"))
    yield engine
    await engine.dispose()


async def serving(
    release: Release, name: str, logs: Path, env: dict[str, str]
) -> tuple[Process, str]:
    """`serve` of a release, ready; and its URL."""
    port = free_port()
    conductor = start(
        release, name, ["serve"], logs, RIG_HTTP_HOST="127.0.0.1", RIG_HTTP_PORT=str(port), **env
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url) as client:

        async def ready() -> bool:
            assert conductor.process.poll() is None, conductor.output()[-3000:]
            try:
                return (await client.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_for(ready, within=60)
    return conductor, url


def start_agent(
    release: Release, agent_id: str, logs: Path, conductor_url: str, env: dict[str, str]
) -> Process:
    """`rig-conductor agent` of a release, running its own tests/e2e/handlers.py."""
    args = ["agent", "--agent-id", agent_id, "--group", GROUP, "--stream", STREAM]
    return start(
        release,
        f"{agent_id}-{release.name}",
        [*args, "--handler", HANDLER],
        logs,
        RIG_CONDUCTOR_URL=conductor_url,
        CONSUMER_ID=f"{agent_id}-pod-0",
        **env,
    )


def leadership(log: str) -> list[tuple[datetime, str]]:
    """(when, "up" | "down") from a JSON log: the replica took or left the reaper's lease."""
    turns = []
    for line in log.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        message = record.get("message", "")
        if "is now the leader" in message:
            turns.append((datetime.fromisoformat(record["time"]), "up"))
        elif "is no longer the leader" in message or "Released the reaper lease" in message:
            turns.append((datetime.fromisoformat(record["time"]), "down"))
    return turns


def terms(log: str, end: datetime) -> list[tuple[datetime, datetime]]:
    """The spans a replica held the lease, the last one open until `end`."""
    spans, since = [], None
    for when, turn in leadership(log):
        if turn == "up" and since is None:
            since = when
        elif turn == "down" and since is not None:
            spans.append((since, when))
            since = None
    if since is not None:
        spans.append((since, end))
    return spans


async def dispatching(proxy: Proxy, issues: list[str], dispatched: dict[str, str]) -> None:
    """The dispatcher: one issue every 50 ms through the proxy; a refused one fails the test."""
    async with httpx.AsyncClient(base_url=proxy.url, timeout=30) as api:
        for issue in issues:
            event = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "builder"}
            answer = await api.post("/api/events", json={**event, "payload": {"title": issue}})
            assert answer.status_code == 201, answer.text
            dispatched[issue] = answer.json()["entryId"]
            await asyncio.sleep(0.05)  # a steady flow of work, not a burst


async def test_a_rolling_upgrade_loses_nothing_and_answers_no_5xx(
    previous: Release,
    empty_database: str,
    upgrade_engine: AsyncEngine,
    redis: Redis,
    redis_url: str,
    tmp_path: Path,
) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    env = conductor_env(AGENTS) | {
        "RIG_REDIS_URL": redis_url,
        "RIG_DATABASE_URL": empty_database,
        "RIG_LOG_FORMAT": "json",
        # No agent dies here: nothing may be reclaimed from a live one that is merely slow.
        "RIG_ENTRY_STALE_MS": "60000",
        "RIG_AGENT_DOWN_MS": "60000",
    }
    migrated = await run(previous, ["migrate"], **env)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    agent_env = {
        "RIG_REDIS_URL": redis_url,
        "RIG_HEARTBEAT_INTERVAL_S": "0.5",
        "RIG_SCAN_INTERVAL_S": "1",
        "E2E_OUT_DIR": str(out),
        "E2E_WORK_S": "0.05",
    }
    processes: list[Process] = []
    dispatched: dict[str, str] = {}
    issues = [f"up-{n}" for n in range(1, 121)]
    try:
        async with running_proxy() as proxy:
            old, old_url = await serving(previous, "serve-previous", logs, env)
            processes.append(old)
            proxy.backends = [old_url]
            for agent_id in AGENTS[:2]:
                processes.append(start_agent(previous, agent_id, logs, proxy.url, agent_env))
            async with httpx.AsyncClient(base_url=proxy.url) as api:
                await wait_for(lambda: heard_from(api, "builder-b-pod-0"), within=60)
            dispatcher = asyncio.create_task(dispatching(proxy, issues[:80], dispatched))
            await wait_for(lambda: len(effects(out)) >= 10 or dispatcher.done(), within=60)

            # N's migrate while N-1 serves and its agents work; then N beside N-1.
            migrated = await run(CURRENT, ["migrate"], **env)
            assert migrated.returncode == 0, migrated.stderr[-3000:]
            new, new_url = await serving(CURRENT, "serve-current", logs, env)
            processes.append(new)
            proxy.backends = [old_url, new_url]
            processes.append(start_agent(CURRENT, AGENTS[2], logs, proxy.url, agent_env))
            await wait_for(lambda: proxy.served_by(new_url) >= 50, within=60)

            # N-1 leaves the Service, then stops.
            proxy.backends = [new_url]
            assert await old.stop() == 0, old.output()[-3000:]
            await dispatcher
            # The rest through N alone, to the agents of both releases.
            await dispatching(proxy, issues[80:], dispatched)

            async def settled() -> bool:
                done = await accepted_completions(upgrade_engine)
                return set(dispatched.values()) <= set(done) and not await pending(redis)

            await wait_for(settled, within=90)
            # N took the reaper's lease over once N-1 let it go.
            await wait_for(lambda: any(t == "up" for _, t in leadership(new.output())), within=60)
            completions = await accepted_completions(upgrade_engine)
            failures = proxy.failures()
    finally:
        for process in reversed(processes):
            await process.stop()

    report = "\n".join(f"--- {p.name}:\n{p.output()[-2500:]}" for p in processes)
    assert len(dispatched) == len(issues)
    assert not failures, f"answered 5xx or not at all: {failures[:10]}"
    # Done exactly once: one handler call, one accepted completion, one effect per issue.
    done_twice = {issue: calls(out, issue) for issue in issues if len(calls(out, issue)) != 1}
    assert not done_twice, done_twice
    assert all(len(completions[entry]) == 1 for entry in dispatched.values()), completions
    assert set(effects(out)) == set(issues)
    # The agents of both releases did the work.
    consumers = {c.consumer for done in completions.values() for c in done}
    assert consumers == {f"{agent}-pod-0" for agent in AGENTS}, consumers
    for process in processes:
        assert "Traceback" not in process.output(), report
    # One reaper at a time: the lease spans of N-1 and N do not overlap.
    end = datetime.fromisoformat(
        json.loads([line for line in new.output().splitlines() if line.startswith("{")][-1])["time"]
    )
    spans = [
        (name, span) for name, p in (("N-1", old), ("N", new)) for span in terms(p.output(), end)
    ]
    assert any(name == "N-1" for name, _ in spans) and any(name == "N" for name, _ in spans), spans
    for name, (start_a, end_a) in spans:
        for other, (start_b, end_b) in spans:
            if name != other:
                assert end_a <= start_b or end_b <= start_a, spans
