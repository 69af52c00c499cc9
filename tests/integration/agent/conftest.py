"""A real conductor (uvicorn, in-process, on a free port) for the agent runtime's tests, and
agent settings pointing at it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvicorn
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.agent.settings import AgentSettings
from rig_conductor.app import create_app
from rig_conductor.settings import Settings

from ..helpers import free_port, wait_for
from .harness import AGENT, S


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # leave the test process's signals alone
        yield


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, *, wrap: Callable[[Any], Any] = lambda app: app
) -> AsyncIterator[str]:
    """The conductor's app for `settings` (as `wrap` returns it) on a free port; yields its base
    URL."""
    port = free_port()
    config = uvicorn.Config(
        wrap(create_app(settings, schedule_reaper=False)),
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
    )
    server = _Server(config)
    serving = asyncio.create_task(server.serve())
    await wait_for(lambda: server.started or serving.done(), within=15)
    assert not serving.done(), "the conductor did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


def conductor_settings(make_settings: Callable[..., Settings], **overrides: Any) -> Settings:
    """The settings the `conductor` fixture serves with, plus `overrides`."""
    return make_settings(
        **{
            "streams": (S,),
            "dispatch_stream": S,
            "agent_ids": (AGENT, "qa-e"),
            "entry_stale_ms": 0,
            "max_deliveries": 2,
            **overrides,
        }
    )


@pytest.fixture(autouse=True)
def _outcomes_in_reports(caplog: pytest.LogCaptureFixture) -> None:
    """The runtime's INFO lines (each entry's outcome, a conductor given up on and found again)
    in a failed test's report: the warnings alone do not say where an entry stopped."""
    caplog.set_level(logging.INFO, logger="rig_conductor.agent")


@pytest.fixture
async def conductor(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[str]:
    """A real conductor on a free port; the reaper only runs through /api/reaper/scan."""
    async with serving(conductor_settings(make_settings)) as url:
        yield url


@pytest.fixture
def settings(redis_url: str, conductor: str) -> Callable[..., AgentSettings]:
    def build(**overrides: Any) -> AgentSettings:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "conductor_url": conductor,
            "heartbeat_interval_s": 0.3,
            "scan_interval_s": 60,
            "max_deliveries": 2,
            "dispatch_stream": S,
        }
        values.update(overrides)
        return AgentSettings(**values)

    return build
