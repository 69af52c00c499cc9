"""PostgreSQL restarted, and stopped for a while, under a running `serve`: no 500 and no restart.

While it is down, every call that needs it answers 503 with Retry-After and the scans fail,
logged and counted; `serve` keeps running. When it is back the same calls succeed, on the
connections the conductor opens again by itself. Directly and through PgBouncer (transaction
pooling), where the errors differ: the pooler keeps the client connections and answers for
PostgreSQL ("server login has been failing").
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import httpx
import pytest
from redis.asyncio import Redis

from ..helpers import Conductor, serve, wait_for
from .conftest import Database, metric, rig_conductor
from .servers import PgBouncer, PrivatePostgres

pytestmark = pytest.mark.timeout(240)

S = "rig:dispatch"
Call = Callable[[], Awaitable[httpx.Response]]


class Calls:
    """The API calls that need PostgreSQL, each answer remembered."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.statuses: list[int] = []
        self._issues = itertools.count()
        self.pending_dispatch: str | None = None  # one the outage interrupted, to retry

    async def _answer(self, request: Awaitable[httpx.Response]) -> httpx.Response:
        answer = await request
        self.statuses.append(answer.status_code)
        return answer

    async def heartbeat(self) -> httpx.Response:
        event = {"type": "HEARTBEAT", "agentId": "qa-e", "consumer": "qa-e-0"}
        return await self._answer(self.client.post("/api/events", json=event))

    async def dispatch(self) -> httpx.Response:
        issue = self.pending_dispatch or f"rc-{next(self._issues)}"
        event = {"type": "ISSUE_ASSIGNED", "issueId": issue, "agentId": "qa-e"}
        answer = await self._answer(self.client.post("/api/events", json=event))
        self.pending_dispatch = issue if answer.status_code == 503 else None
        return answer

    async def agents(self) -> httpx.Response:
        return await self._answer(self.client.get("/api/agents"))

    async def scan(self) -> httpx.Response:
        return await self._answer(self.client.post("/api/reaper/scan", params={"dryRun": "true"}))

    async def all_succeed(self) -> None:
        """Every call answers as it should, at the first try."""
        assert (await self.heartbeat()).status_code == 202
        assert (answer := await self.dispatch()).status_code in (200, 201), answer.text
        assert (answer := await self.agents()).status_code == 200, answer.text
        assert (answer := await self.scan()).status_code == 200, answer.text

    async def all_unavailable(self) -> None:
        for call in (self.heartbeat, self.dispatch, self.agents, self.scan):
            answer = await call()
            assert answer.status_code == 503, (call.__name__, answer.status_code, answer.text)
            assert answer.headers["Retry-After"].isdigit(), call.__name__
            assert "PostgreSQL" in answer.json()["detail"], answer.text


async def errors(client: httpx.AsyncClient, conductor: Conductor) -> float:
    return await metric(client, conductor.url, "rig_reaper_scans_total", outcome="error")


async def ok_scans(client: httpx.AsyncClient, conductor: Conductor) -> float:
    return await metric(client, conductor.url, "rig_reaper_scans_total", outcome="ok")


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
async def test_serve_rides_out_a_postgres_restart_and_an_outage(
    via: str,
    redis: Redis,
    redis_url: str,
    database: Database,
    private_pg: PrivatePostgres,
    request: pytest.FixtureRequest,
) -> None:
    assert rig_conductor("migrate", database_url=database.direct_url).returncode == 0
    url = database.direct_url
    if via == "pgbouncer":
        bouncer: PgBouncer = request.getfixturevalue("bouncer")
        url = bouncer.url(database.name)
    env = {
        "RIG_STREAMS": S,
        "RIG_AGENT_IDS": "qa-e",
        "RIG_SCAN_INTERVAL_S": "0.5",
        "RIG_STARTUP_DELAY_S": "0",
        "RIG_K8S_ENABLED": "false",
    }
    async with (
        serve(redis_url, url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url, timeout=60) as client,
    ):
        calls = Calls(client)

        async def scanning() -> bool:
            return await ok_scans(client, conductor) >= 2

        await wait_for(scanning, within=20)
        for _ in range(3):  # the engine's pool and the heartbeat writer hold connections now
            await calls.all_succeed()

        # A restart between two calls: every connection the conductor holds is stale.
        private_pg.stop()
        private_pg.start()
        if via == "pgbouncer":
            await asyncio.sleep(1.5)  # the pooler retries its login each second
        await calls.all_succeed()

        # An outage.
        private_pg.stop()
        failed = await errors(client, conductor)
        await calls.all_unavailable()
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200

        async def scans_fail() -> bool:
            return await errors(client, conductor) >= failed + 3

        await wait_for(scans_fail, within=20)
        assert "Scan failed: PostgreSQL unavailable" in conductor.stderr
        # Past the lease's deadline the scans still fail, for want of an election.
        await wait_for(lambda: "no longer the leader (lease-row)" in conductor.stderr, within=20)
        failing = await errors(client, conductor)

        async def election_fails() -> bool:
            elected = "no active reaper can be elected" in conductor.stderr
            return elected and await errors(client, conductor) > failing

        await wait_for(election_fails, within=20)
        await calls.all_unavailable()
        assert conductor.process.poll() is None  # serve keeps running

        # PostgreSQL is back: the same calls succeed, no restart; the dispatch the outage cut
        # off is completed by its retry (the entry was appended once, before the outage hit).
        private_pg.start()
        interrupted = calls.pending_dispatch
        assert interrupted is not None

        async def available() -> bool:
            return (await client.get("/readyz")).status_code == 200

        await wait_for(available, within=20)
        retried = await calls.dispatch()
        assert retried.status_code == 200, retried.text  # the original entry, now recorded
        await calls.all_succeed()
        scanned = await ok_scans(client, conductor)

        async def scanning_again() -> bool:
            return await ok_scans(client, conductor) > scanned

        await wait_for(scanning_again, within=30)
        assert "is now the leader (lease-row)" in conductor.stderr.split("no longer")[-1]
    assert 500 not in calls.statuses
    assert " 500 " not in conductor.stderr and "Traceback" not in conductor.stderr
    assert conductor.process.returncode == 0, conductor.stderr[-3000:]
    dispatched = await redis.xrange(S)
    assert len(dispatched) == len({fields["issueId"] for _, fields in dispatched})
