"""The agent's heartbeat loop keeps a live agent heard (reaper rule 3): a conductor slow to answer
(just started, under load) still gets its heartbeats, since one with no answer within the
interval is left to finish, not cancelled (a request cancelled before the conductor read it is
lost); and an unexpected error in one heartbeat, or a cancellation leaked out of a client, is
logged, never the end of the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.heartbeats import HeartbeatLoop
from rig_conductor.agent.lease import ConsumerLease
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.settings import Settings

from ..helpers import heartbeats_stored, wait_for
from .conftest import conductor_settings, serving
from .harness import AGENT, ME, S, agent_of, running

INTERVAL_S = 0.3
DELAY_S = 1.0  # over three intervals before the conductor reads a request


class Slow:
    """The conductor's app, reading each event's request only `DELAY_S` after it came in."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/api/events":
            await asyncio.sleep(DELAY_S)
        await self.app(scope, receive, send)


async def test_heartbeats_slower_than_the_interval_are_stored(
    make_settings: Callable[..., Settings],
    redis: Redis,
    redis_url: str,
    engine: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving(conductor_settings(make_settings), wrap=Slow) as url:
        settings = AgentSettings(
            redis_url=redis_url,
            conductor_url=url,
            heartbeat_interval_s=INTERVAL_S,
            scan_interval_s=60,
            dispatch_stream=S,
        )
        async with running(lambda entry: None, settings):
            # The first, before anything is read, waits as long as it takes; then the loop's.
            await wait_for(lambda: "Heartbeat not answered within" in caplog.text, 15)
            stored = await heartbeats_stored(engine)

            async def more() -> bool:
                return await heartbeats_stored(engine) >= stored + 3

            await wait_for(more, within=15)


class _FailsOnce(ConductorClient):
    """A conductor client whose second heartbeat fails with `error`, which nobody expects."""

    def __init__(self, error: BaseException, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error
        self.beats = 0

    async def heartbeat(self, *, degraded: bool = False, reasons: Sequence[str] = ()) -> None:
        self.beats += 1
        if self.beats == 2:
            raise self.error
        await super().heartbeat(degraded=degraded, reasons=reasons)


@pytest.mark.parametrize(
    ("error", "logged"),
    [
        (RuntimeError("a bug in the heartbeat"), "RuntimeError: a bug in the heartbeat"),
        # As a client's own timeout handling can let one out: the heartbeat's task ends
        # cancelled, though nobody cancelled it.
        (asyncio.CancelledError(), "Heartbeat cancelled before its answer"),
    ],
    ids=["error", "leaked-cancellation"],
)
async def test_an_unexpected_heartbeat_error_is_logged_and_the_loop_beats_on(
    error: BaseException,
    logged: str,
    redis: Redis,
    settings: Callable[..., AgentSettings],
    conductor: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    client = _FailsOnce(error, base_url=conductor, agent_id=AGENT, consumer=ME)
    agent = agent_of(
        lambda entry: None, settings(), redis=redis, conductor=client, stop=stop, block_ms=100
    )
    run = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: client.beats >= 5 or run.done(), within=15)
        assert not run.done(), run
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
        await client.aclose()
    assert logged in caplog.text
    assert "The heartbeat loop ended" not in caplog.text


class _RenewCancelledOnce(ConsumerLease):
    """A real lease whose second renewal ends in a cancellation nobody asked for."""

    renewals = 0

    async def renew(self) -> bool:
        self.renewals += 1
        if self.renewals == 2:
            raise asyncio.CancelledError
        return await super().renew()


async def test_a_cancellation_leaked_out_of_a_lease_renewal_does_not_end_the_loop(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lease = _RenewCancelledOnce(redis, key=f"{S}:lease-test", ttl_ms=5_000)
    assert await lease.acquire()
    beats = 0

    async def beat() -> None:
        nonlocal beats
        beats += 1

    stop = asyncio.Event()
    loop = HeartbeatLoop(lease=lease, beat=beat, interval_s=0.05, consumer=ME, stop=stop)
    run = asyncio.create_task(loop.run())
    run.add_done_callback(loop.ended)
    try:
        await wait_for(lambda: beats >= 4 or run.done(), within=15)
        assert not run.done(), run
    finally:
        loop.close()
        await asyncio.wait_for(run, 15)
    assert not stop.is_set()
    assert "cancelled beneath the loop" in caplog.text
