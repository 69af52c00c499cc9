"""A PostgreSQL outage is the conductor's blind spell, not the fleet's silence (reaper rule 3).

A real `serve` on the module's private PostgreSQL, scanning every 0.3 s with RIG_AGENT_DOWN_MS
of 3 s. An agent holds entries and heartbeats every 0.3 s, retrying through the outage (its
heartbeats answer 503). PostgreSQL is stopped for 8 s, far longer than RIG_AGENT_DOWN_MS, and
started again. The first scans after it see the agent's last stored heartbeat 8 s old; the
spell does not count, so nothing of the agent's moves. Another agent that died just before the
outage is still reclaimed, later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta

import httpx
import pytest
from redis.asyncio import Redis

from rig_conductor.adapters.postgres import engine as pg_engine
from rig_conductor.adapters.postgres import listening, queries
from rig_conductor.domain import ConsumerName
from rig_conductor.policy import blind

from ..helpers import fill, owners, read, register, serve, wait_for
from .conftest import Database, metric, rig_conductor
from .servers import PrivatePostgres

pytestmark = pytest.mark.timeout(240)

S, G = "rig:dispatch", "workers"
LIVE, DEAD = "live-e-0", "dead-e-0"
DOWN_S = 3.0
SLACK_MS = 300  # the listening slack RIG_AGENT_DOWN_MS of 3 s gives (settings.listen_slack_ms)


def heartbeat(agent: str, consumer: str) -> dict[str, str]:
    return {"type": "HEARTBEAT", "agentId": agent, "consumer": consumer}


async def heartbeats(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
    """The live agent: a heartbeat every 0.3 s, whatever the answer (503 during the outage)."""
    event = heartbeat("live-e", LIVE)
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            await client.post("/api/events", json=event)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.3)


async def heard_before_the_spell(database_url: str, consumer: str) -> float:
    """Seconds the conductor heard between `consumer`'s last heartbeat and the outage's blind
    spell (the longest), as PostgreSQL recorded them: the consumer's heartbeat and the listening
    marks, read and judged as a scan does (docs/rules.md, rule 3). A loaded machine's late marks
    make short spells of their own before it; what they cover was not heard either."""
    engine = pg_engine.create_engine(database_url)
    try:
        beats = await queries.own_heartbeats(engine, tenant="default", consumers=[consumer])
        async with engine.connect() as conn:
            heard = await listening.heard(conn, tenant="default")
        now = await queries.clock(engine)
    finally:
        await engine.dispose()
    last_beat = beats[ConsumerName(consumer)].at
    spells = blind.blind_spells(heard, now=now, slack_ms=SLACK_MS)
    assert spells, f"no blind spell: {heard}"
    outage = max(spells, key=lambda spell: spell.end - spell.start)
    assert outage.start > last_beat, f"the outage's spell before the last heartbeat: {spells}"
    blind_before = sum(
        (
            min(spell.end, outage.start) - max(spell.start, last_beat)
            for spell in spells
            if spell.end > last_beat and spell.start < outage.start
        ),
        timedelta(),
    )
    return (outage.start - last_beat - blind_before).total_seconds()


async def test_an_outage_longer_than_the_down_time_takes_no_live_agents_work(
    redis: Redis, redis_url: str, database: Database, private_pg: PrivatePostgres
) -> None:
    assert rig_conductor("migrate", database_url=database.direct_url).returncode == 0
    await fill(redis, S, G, 6)
    await register(redis, S, G, "spare-e-0")
    env = {
        "RIG_STREAMS": S,
        "RIG_AGENT_IDS": "live-e,dead-e,spare-e",
        "RIG_AGENT_DOWN_MS": str(int(DOWN_S * 1000)),
        "RIG_ENTRY_STALE_MS": "0",
        "RIG_SCAN_INTERVAL_S": "0.3",
        "RIG_STARTUP_DELAY_S": "0",
        "RIG_K8S_ENABLED": "false",
    }
    stop = asyncio.Event()
    async with (
        serve(redis_url, database.direct_url, **env) as conductor,
        httpx.AsyncClient(base_url=conductor.url, timeout=30) as client,
    ):
        spare = heartbeat("spare-e", "spare-e-0")
        for beat in (heartbeat("live-e", LIVE), spare, heartbeat("dead-e", DEAD)):
            assert (await client.post("/api/events", json=beat)).status_code == 202
        # Entries only once every agent is heard: an agent that never heartbeated is down, and
        # a scan (every 0.3 s) between two of these posts would move its entries at once.
        live_held = await read(redis, S, G, LIVE, 3)
        await read(redis, S, G, DEAD, 3)
        beating = asyncio.create_task(heartbeats(client, stop))
        try:
            await asyncio.sleep(1.0)  # the dead agent's last heartbeat, 1 s before the outage
            private_pg.stop()
            await asyncio.sleep(8.0)  # the outage: past RIG_AGENT_DOWN_MS, a spell to count
            # The spell ends once PostgreSQL answers again, which is no sooner than its start
            # begins (`start()` returns later still, the later the more loaded the machine).
            recovered = time.monotonic()
            private_pg.start()
            assert (await client.post("/api/events", json=spare)).status_code in (202, 503)

            async def spell_seen() -> bool:
                return await metric(client, conductor.url, "rig_blind_seconds_total") > 5

            await wait_for(spell_seen, within=30)

            # The dead agent: down once RIG_AGENT_DOWN_MS of heard time has passed since its
            # last heartbeat, the spell left out.
            async def dead_moved() -> bool:
                held = await owners(redis, S, G)
                return DEAD not in held.values()

            await wait_for(dead_moved, within=30)
            heard_before = await heard_before_the_spell(database.direct_url, DEAD)
            # The spell ends no sooner than `recovered`: what was still owed after it came
            # after it. About 1.3 s was heard before the spell (the sleep above and the slack),
            # more on a loaded machine, where the stop itself comes later.
            owed = DOWN_S - heard_before
            assert time.monotonic() - recovered >= owed - 0.1, (heard_before, owed)
            # Scans have run since; the live agent kept every entry.
            before = await metric(client, conductor.url, "rig_reaper_scans_total", outcome="ok")

            async def scanned() -> bool:
                done = await metric(client, conductor.url, "rig_reaper_scans_total", outcome="ok")
                return done >= before + 5

            await wait_for(scanned, within=30)
            held = await owners(redis, S, G)
            assert {entry: held.get(entry) for entry in live_held} == dict.fromkeys(live_held, LIVE)
            reclaimed = await metric(
                client,
                conductor.url,
                "rig_reclaimed_entries_total",
                stream=S,
                group=G,
                from_agent="live-e",
                to_agent="spare-e",
                reason="down",
            )
            assert reclaimed == 0
        finally:
            stop.set()
            await beating
            if not private_pg.running():
                private_pg.start()
