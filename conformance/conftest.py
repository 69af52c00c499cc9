"""The conformance suite's fixtures: the implementation under test (`--agent`), real servers
(embedded ones unless RIG_TEST_REDIS_URL / RIG_TEST_DATABASE_URL name others, as in `tests/`),
and the world each scenario runs in (`kit.World`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine
from tests import conftest as servers
from tests.integration import ts_agent

from conformance import kit
from conformance.agents import AgentUnderTest, resolve

# The servers, exactly as the test suite gets them, and the TypeScript package's build.
_servers = servers._servers
embedded_redis_url = servers.embedded_redis_url
redis_url = servers.redis_url
database_url = servers.database_url
redis = servers.redis
engine = servers.engine
rig_agent = ts_agent.rig_agent_fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--agent",
        default=os.environ.get("CONFORMANCE_AGENT", "python"),
        help="the implementation under test: python, typescript, broken:<flaw>, or a command "
        "line (conformance/agents.py); default $CONFORMANCE_AGENT, else python",
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"conformance: agent {config.getoption('--agent')!r}"


@pytest.fixture(scope="session")
def agent_under_test(request: pytest.FixtureRequest) -> AgentUnderTest:
    try:
        agent = resolve(request.config.getoption("--agent"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if agent.needs_typescript_build:
        request.getfixturevalue("rig_agent")  # npm ci and the build, once a run
    return agent


@pytest.fixture
async def agent_redis_url(redis: Redis, redis_url: str) -> str:
    """Where agents sign in: as the agent's least-privilege user on a Redis that has ACL
    selectors (7 and later), with the administrator's URL on an older one (the embedded 6.2):
    `test_a_least_privilege_agent_user_suffices` then brings a Redis 7 of its own."""
    if await kit.supports_selectors(redis):
        return await kit.agent_user_url(redis, redis_url)
    return redis_url


@pytest.fixture
def world(
    agent_under_test: AgentUnderTest,
    redis: Redis,
    engine: AsyncEngine,
    redis_url: str,
    database_url: str,
    agent_redis_url: str,
    tmp_path: Path,
) -> Callable[..., contextlib.AbstractAsyncContextManager[kit.World]]:
    """`async with world(**conductor settings) as w:` a conductor serving, agents to start."""

    @contextlib.asynccontextmanager
    async def build(
        *, redis_url: str = redis_url, admin: Redis | None = None, **env: Any
    ) -> AsyncIterator[kit.World]:
        """`redis_url` and `admin`: another Redis (7 or later) for the conductor and agents."""
        if admin is None:
            state = kit.World(agent_under_test, redis, engine, tmp_path, agent_redis_url)
        else:
            signed_in = await kit.agent_user_url(admin, redis_url)
            state = kit.World(agent_under_test, admin, engine, tmp_path, signed_in)
        async with kit.conducted(state, redis_url, database_url, **env) as ready:
            yield ready

    return build
