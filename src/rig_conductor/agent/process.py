"""Running an agent as a process: its Redis and conductor clients, and SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator

from rig_conductor.adapters.redis import access as redis_access
from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.agent.conductor import ConductorClient
from rig_conductor.agent.entry import Handler, consumer_name
from rig_conductor.agent.runtime import BLOCK_MS, SHUTDOWN_GRACE_S, Agent
from rig_conductor.agent.settings import AgentSettings, load_agent_settings
from rig_conductor.agent.token_file import TokenFile

logger = logging.getLogger(__name__)


async def run_agent(
    handler: Handler,
    *,
    agent_id: str,
    group: str,
    settings: AgentSettings | None = None,
    stream: str | None = None,
    start_id: str = "0",
    consumer: str | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    block_ms: int = BLOCK_MS,
) -> None:
    """Run an agent until `stop` is set (or SIGTERM/SIGINT with `handle_signals`).

    Raises ConsumerInUse when another live process holds the consumer name, LeaseLost when one
    takes it over, RedisError when Redis is unreachable at start, TokenFileError when
    RIG_API_TOKEN_FILE cannot be read at start.
    """
    settings = settings or load_agent_settings()
    name = consumer or consumer_name(agent_id)
    token_file = TokenFile(settings.api_token_file) if settings.api_token_file else None
    redis = await _redis_allowed(settings, stream or settings.dispatch_stream, agent_id)
    conductor = ConductorClient(
        base_url=settings.conductor_url,
        agent_id=agent_id,
        consumer=name,
        group=group,
        token=settings.token,
        token_file=token_file,
    )
    agent = Agent(
        handler,
        settings=settings,
        agent_id=agent_id,
        group=group,
        stream=stream or settings.dispatch_stream,
        consumer=name,
        redis=redis,
        conductor=conductor,
        start_id=start_id,
        stop=stop,
        shutdown_grace_s=shutdown_grace_s,
        block_ms=block_ms,
    )
    # The handlers stay until the clients are closed: a second SIGTERM while they close must
    # not kill the process with the signal's default action.
    with _signals(agent) if handle_signals else contextlib.nullcontext():
        try:
            await agent.run()
        finally:
            await conductor.aclose()
            await redis.aclose()


class MissingPermission(Exception):
    """The Redis user may not run a command the agent needs (one line naming it)."""


async def _redis_allowed(settings: AgentSettings, stream: str, agent_id: str) -> AnyRedis:
    """A Redis client whose user may run every command the agent needs on `stream` and on
    `agent_id`'s own keys. A user with more (the conductor's rights, one user shared by all) is
    warned about: it keeps working."""
    redis = redis_client.connect(settings)
    try:
        missing = await redis_access.missing_permission(
            redis, role="agent", streams=[stream], agent_id=agent_id
        )
        shared = missing is None and await redis_access.over_privileged(redis, stream=stream)
    except BaseException:
        await redis.aclose()
        raise
    if missing is not None:
        await redis.aclose()
        raise MissingPermission(missing)
    if shared:
        logger.warning(
            "This agent's Redis user may add entries to %s (XADD): it has the conductor's rights, "
            "so this agent could forge dispatches, dead letters or markers. Give each agent its "
            "own user: `rig-conductor redis-acl --agent-id %s` prints it",
            stream,
            agent_id,
        )
    return redis


@contextlib.contextmanager
def _signals(agent: Agent) -> Iterator[None]:
    loop = asyncio.get_running_loop()

    def received(sig: signal.Signals) -> None:
        if agent.stop.is_set():
            logger.warning("%s again: abandoning the current entry", sig.name)
            agent.abandon()
            return
        logger.info("%s received: stopping after the current entry", sig.name)
        agent.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, received, sig)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
