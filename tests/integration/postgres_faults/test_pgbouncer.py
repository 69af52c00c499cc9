"""`RIG_DATABASE_URL` pointing at Debian's PgBouncer in transaction pooling mode: everything
works, including one active reaper and its takeover, with no server-side prepared statement
and no session state across transactions.

PgBouncer hands out its server connections in turn (`server_round_robin`), so a statement
prepared on one would soon run on another and fail ("prepared statement ... does not exist" or
"already exists"), and a session advisory lock would be left on whichever took it.
"""

from __future__ import annotations

import asyncio
import os
import signal

import httpx
import psycopg
import pytest
from redis.asyncio import Redis

from rig_conductor.reaper.leader import DEFAULT_LEASE_DURATION_S

from ..helpers import Conductor, fill, owners, read, register, serve, wait_for
from .conftest import Database, metric, rig_conductor
from .servers import PgBouncer, PrivatePostgres

pytestmark = pytest.mark.timeout(240)

S, G = "rig:dispatch", "workers"
DEAD, LIVE = "dev-e-0", "qa-e-0"
SERVE_ENV = {
    "RIG_STREAMS": S,
    "RIG_AGENT_IDS": "dev-e,qa-e",
    "RIG_ENTRY_STALE_MS": "0",
    "RIG_K8S_ENABLED": "false",
}
# No statement may fail for a reason the pooler causes.
POOLER_FAULTS = ("prepared statement", "advisory", "Traceback", " 500 ")


def no_pooler_faults(conductor: Conductor) -> None:
    for fault in POOLER_FAULTS:
        assert fault not in conductor.stderr, conductor.stderr[-3000:]


async def test_migrate_direct_then_everything_through_pgbouncer(
    redis: Redis, redis_url: str, database: Database, bouncer: PgBouncer
) -> None:
    migrated = rig_conductor("migrate", database_url=database.direct_url)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    pooled = bouncer.url(database.name)
    assert rig_conductor("check", database_url=pooled).returncode == 0

    scans_when_asked = {"RIG_SCAN_INTERVAL_S": "3600", "RIG_STARTUP_DELAY_S": "3600"}
    async with (
        serve(redis_url, pooled, **SERVE_ENV, **scans_when_asked) as conductor,
        httpx.AsyncClient(base_url=conductor.url, timeout=30) as client,
    ):
        await wait_for(lambda: "is now the leader (lease-row)" in conductor.stderr, within=20)

        # Dispatch, then one agent reads it all and dies; the other heartbeats.
        for n in range(6):
            answer = await client.post(
                "/api/events",
                json={"type": "ISSUE_ASSIGNED", "issueId": f"rc-{n}", "agentId": "dev-e"},
            )
            assert answer.status_code == 201, answer.text
        repeat = await client.post(
            "/api/events", json={"type": "ISSUE_ASSIGNED", "issueId": "rc-0", "agentId": "x"}
        )
        assert repeat.status_code == 200  # the dispatch record, read back through the pooler
        await redis.xgroup_create(S, G, id="0")
        ids = await read(redis, S, G, DEAD, 6)
        await register(redis, S, G, LIVE)

        # Many requests at once, each statement many times over: the engine's pool, the
        # heartbeat writer's connection and the pooler's server connections all mix.
        async def heartbeat(n: int) -> int:
            event = {"type": "HEARTBEAT", "agentId": "qa-e", "consumer": LIVE}
            if n % 2:
                event = {"type": "HEARTBEAT", "agentId": f"load-{n % 7}"}
            return (await client.post("/api/events", json=event)).status_code

        async def view(n: int) -> int:
            return (await client.get("/api/agents", params={"limit": 5 + n % 3})).status_code

        for _ in range(4):
            statuses = await asyncio.gather(
                *(heartbeat(n) for n in range(20)), *(view(n) for n in range(10))
            )
            assert set(statuses) <= {200, 202}, statuses

        # A non-dry scan on the elected replica reclaims the dead agent's entries.
        scanned = await client.post("/api/reaper/scan", params={"dryRun": "false"})
        assert scanned.status_code == 200, scanned.text
        assert scanned.json()["reclaimed"] == 6
        assert await owners(redis, S, G) == dict.fromkeys(ids, LIVE)

        agents = (await client.get("/api/agents")).json()
        assert {"dev-e", "qa-e"} <= {agent["agentId"] for agent in agents}
        errors = await metric(client, conductor.url, "rig_reaper_scans_total", outcome="error")
        assert errors == 0
    assert conductor.process.returncode == 0
    no_pooler_faults(conductor)
    assert "Released the reaper lease of tenant default" in conductor.stderr


def test_migrate_itself_works_through_pgbouncer(database: Database, bouncer: PgBouncer) -> None:
    """What docs/operating.md says `migrate` needs: one transaction for all the migrations (with
    a transaction-scoped advisory lock), nothing prepared, nothing kept in the session. So it
    works through the pooler too; a direct URL is needed only where the pooler's limits would
    cut that transaction short."""
    pooled = bouncer.url(database.name)
    for _ in range(2):  # idempotent
        migrated = rig_conductor("migrate", database_url=pooled)
        assert migrated.returncode == 0, migrated.stderr[-2000:]
    assert rig_conductor("check", database_url=database.direct_url).returncode == 0


def lease_holder(private_pg: PrivatePostgres, database: Database) -> str | None:
    with psycopg.connect(private_pg.conninfo(database.name), autocommit=True) as conn:
        row = conn.execute("SELECT holder FROM reaper_lease WHERE tenant = 'default'").fetchone()
        return row[0] if row else None


def holder_pid(holder: str | None) -> int | None:
    """The pid in `<host>_<pid>_<random>`."""
    return int(holder.rsplit("_", 2)[1]) if holder else None


async def test_two_replicas_through_pgbouncer_one_reaps_and_the_other_takes_over_a_sigkill(
    redis: Redis,
    redis_url: str,
    database: Database,
    private_pg: PrivatePostgres,
    bouncer: PgBouncer,
) -> None:
    assert rig_conductor("migrate", database_url=database.direct_url).returncode == 0
    pooled = bouncer.url(database.name)
    env = {**SERVE_ENV, "RIG_SCAN_INTERVAL_S": "0.5", "RIG_STARTUP_DELAY_S": "0"}
    async with (
        serve(redis_url, pooled, **env) as first,
        serve(redis_url, pooled, **env) as second,
        httpx.AsyncClient(timeout=30) as client,
    ):
        replicas = {first.process.pid: first, second.process.pid: second}

        # Exactly one reaps: the holder of the lease row.
        await wait_for(lambda: holder_pid(lease_holder(private_pg, database)) in replicas, 20)
        leader = replicas[holder_pid(lease_holder(private_pg, database)) or 0]
        follower = second if leader is first else first

        async def leader_scanned() -> bool:
            return await ok_scans(client, leader) >= 2

        await wait_for(leader_scanned, within=20)
        assert await ok_scans(client, follower) == 0
        refused = await client.post(f"{follower.url}/api/reaper/scan", params={"dryRun": "false"})
        assert refused.status_code == 409

        # The active reaper dies without a word; a dead agent's entries are waiting.
        os.kill(leader.process.pid, signal.SIGKILL)
        await fill(redis, S, G, 3)
        ids = await read(redis, S, G, DEAD, 3)
        await register(redis, S, G, LIVE)
        beat = {"type": "HEARTBEAT", "agentId": "qa-e", "consumer": LIVE}
        assert (await client.post(f"{follower.url}/api/events", json=beat)).status_code == 202

        # The lease runs out (its duration) and the follower's next attempt takes it (a renew
        # period); then its next scheduled scan reclaims.
        bound = DEFAULT_LEASE_DURATION_S + DEFAULT_LEASE_DURATION_S / 3 + 0.5 + 2.0

        async def taken_over() -> bool:
            return await owners(redis, S, G) == dict.fromkeys(ids, LIVE)

        await wait_for(taken_over, within=bound)
        assert holder_pid(lease_holder(private_pg, database)) == follower.process.pid

        async def follower_scanned() -> bool:  # a scan is counted once it ends, after its moves
            return await ok_scans(client, follower) >= 1

        await wait_for(follower_scanned, within=10)
    assert follower.process.returncode == 0
    assert "is now the leader (lease-row)" in follower.stderr
    no_pooler_faults(follower)
    no_pooler_faults(leader)


async def ok_scans(client: httpx.AsyncClient, conductor: Conductor) -> float:
    return await metric(client, conductor.url, "rig_reaper_scans_total", outcome="ok")
