"""The world a scenario runs in: a real conductor (`rig-conductor serve`) on real Redis and
PostgreSQL, agent processes of the implementation under test, and the checks the scenarios
share. Everything is observed from outside the agent: the conductor's event log, Redis, and the
files the conformance handler leaves (README.md)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from redis.asyncio import Redis
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from tests.e2e.fleet import AgentProcess, spawn
from tests.integration.helpers import Conductor, serve, wait_for

from conformance.agents import REPO, AgentUnderTest
from rig_conductor import redis_rights
from rig_conductor.adapters.postgres.tables import events
from rig_conductor.agent.lease import lease_key

STREAM, DLQ = "rig:dispatch", "rig:dispatch:dlq"
GROUP = "conformance"
AGENT_ID = "conf"
A, B = f"{AGENT_ID}-a", f"{AGENT_ID}-b"
AGENT_PASSWORD = "conformance-agent-password"
# A loaded two-core machine: bounds are generous and every wait is on a condition.
WITHIN = 60.0


def conductor_env(**extra: str) -> dict[str, str]:
    """`rig-conductor serve` on short thresholds: a silent agent is down after 3 s."""
    return {
        "RIG_STREAMS": STREAM,
        "RIG_DISPATCH_STREAM": STREAM,
        "RIG_AGENT_IDS": AGENT_ID,
        "RIG_ENTRY_STALE_MS": "1000",
        "RIG_AGENT_DOWN_MS": "3000",
        "RIG_SCAN_INTERVAL_S": "0.5",
        "RIG_STARTUP_DELAY_S": "0",
        "RIG_MAX_DELIVERIES": "3",
        "RIG_K8S_ENABLED": "false",
        "RIG_ALLOW_ANONYMOUS": "true",
        **extra,
    }


class Report(NamedTuple):
    kind: str
    consumer: str | None
    attempt: int | None
    fenced: bool
    group: str | None


async def supports_selectors(redis: Redis) -> bool:
    """Redis 7 or later: the agent's least-privilege user needs ACL selectors."""
    version = (await redis.info("server"))["redis_version"]
    return int(str(version).split(".")[0]) >= 7


async def agent_user_url(admin: Redis, redis_url: str) -> str:
    """The agent's least-privilege user, exactly as `rig-conductor redis-acl` makes it, and the
    URL that signs in as it."""
    user = redis_rights.agent_user(AGENT_ID)
    rules = redis_rights.agent_rules(AGENT_ID, [STREAM])
    await admin.execute_command("ACL", "SETUSER", user, *rules.split(), "on", f">{AGENT_PASSWORD}")
    return redis_url.replace("redis://", f"redis://{user}:{AGENT_PASSWORD}@", 1)


@dataclass
class World:
    agent: AgentUnderTest
    redis: Redis  # an administrator's client on the conductor's Redis
    engine: AsyncEngine
    workdir: Path
    agent_redis_url: str
    conductor: Conductor | None = None
    agents: list[AgentProcess] = field(default_factory=list)

    @property
    def out(self) -> Path:
        return self.workdir / "out"

    @property
    def url(self) -> str:
        assert self.conductor is not None
        return self.conductor.url

    @property
    def api(self) -> httpx.AsyncClient:
        assert self.conductor is not None
        return httpx.AsyncClient(base_url=self.conductor.url, timeout=30)

    def start(self, consumer: str, *, log_name: str | None = None, **env: str) -> AgentProcess:
        """An agent process of the implementation under test, reading GROUP of STREAM."""
        assert self.conductor is not None
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RIG_")}
        python_path = [p for p in (environment.get("PYTHONPATH"), str(REPO)) if p]
        environment.update(
            {
                "PYTHONPATH": os.pathsep.join(python_path),
                "RIG_REDIS_URL": self.agent_redis_url,
                "RIG_CONDUCTOR_URL": self.conductor.url,
                "RIG_HEARTBEAT_INTERVAL_S": "0.5",
                "RIG_SCAN_INTERVAL_S": "1",
                "RIG_MAX_DELIVERIES": "3",
                "CONSUMER_ID": consumer,
                "CONFORMANCE_OUT": str(self.out),
                **env,
            }
        )
        log = self.workdir / "logs" / f"{log_name or consumer}.log"
        argv = [*self.agent.command, "--agent-id", AGENT_ID, "--group", GROUP, "--stream", STREAM]
        started = spawn(AGENT_ID, consumer, argv, cwd=self.workdir, env=environment, log=log)
        self.agents.append(started)
        return started

    def tails(self) -> str:
        """What a failed wait says: every agent's log tail, and the conductor's."""
        parts = [f"--- agent {a.consumer}:\n{a.output()[-3000:]}" for a in self.agents]
        if self.conductor is not None:
            parts.append(f"--- conductor:\n{self.conductor.stderr[-3000:]}")
        return "\n".join(parts)

    async def until(self, check: Callable[[], object], within: float = WITHIN) -> None:
        await wait_for(check, within=within, explain=self.tails)

    async def dispatch(self, issue: str, payload: dict[str, Any] | None = None) -> str:
        async with self.api as api:
            answer = await api.post(
                "/api/events",
                json={
                    "type": "ISSUE_ASSIGNED",
                    "issueId": issue,
                    "agentId": AGENT_ID,
                    "payload": payload or {},
                },
            )
        assert answer.status_code == 201, answer.text
        entry_id: str = answer.json()["entryId"]
        return entry_id

    async def heard_from(self, consumer: str, **headers: str) -> bool:
        async with self.api as api:
            agents = (await api.get("/api/agents", headers=headers)).json()
        return any(consumer in agent["consumers"] for agent in agents)

    async def flagged(self, consumer: str, reason: str) -> bool:
        """The agent's heartbeats say it is degraded, for `reason` (its only consumer here)."""
        async with self.api as api:
            agents = (await api.get("/api/agents")).json()
        return any(
            consumer in agent["consumers"]
            and agent["degraded"]
            and reason in agent["degradedReasons"]
            for agent in agents
        )

    async def ready(self, *agents: AgentProcess) -> None:
        """Each agent has heartbeated by name (before which it reads nothing)."""
        for agent in agents:
            await self.until(lambda: self.heard_from(agent.consumer))  # noqa: B023

    def calls(self, issue: str) -> list[str]:
        """`<consumer>.a<attempt>` of every handler call on `issue`, sorted."""
        directory = self.out / "calls"
        names = directory.glob(f"{issue}.*") if directory.is_dir() else []
        return sorted(p.name.removeprefix(f"{issue}.") for p in names)

    def effect(self, issue: str) -> dict[str, Any] | None:
        """The published output of `issue`: its handler's staged file, renamed onto its path."""
        path = self.out / "effects" / f"{issue}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def staged_leftovers(self) -> list[str]:
        return sorted(str(p.relative_to(self.out)) for p in self.out.rglob(".*.tmp"))

    def holding(self, issue: str, consumer: str) -> bool:
        return (self.out / "holding" / f"{issue}.{consumer}").exists()

    def release(self, issue: str) -> None:
        (self.out / "release").mkdir(parents=True, exist_ok=True)
        (self.out / "release" / issue).touch()

    async def reports(self, entry_id: str) -> list[Report]:
        """Every WORK_* report on the entry, in the order the conductor took them."""
        query = select(
            events.c.kind,
            events.c.consumer,
            events.c.attempt,
            events.c.fenced,
            events.c.group_name,
        ).where(
            events.c.stream == STREAM, events.c.entry_id == entry_id, events.c.kind.like("WORK_%")
        )
        async with self.engine.connect() as conn:
            rows = await conn.execute(query.order_by(events.c.id))
            return [Report(*row) for row in rows]

    async def completed(self, entry_id: str) -> list[Report]:
        """The entry's completions the conductor accepted."""
        return [
            r for r in await self.reports(entry_id) if r.kind == "WORK_COMPLETED" and not r.fenced
        ]

    async def pending(self, consumer: str | None = None) -> dict[str, str]:
        """The group's (or one consumer's) pending entries: entry id -> holder."""
        try:
            rows = await self.redis.xpending_range(
                STREAM, GROUP, min="-", max="+", count=10_000, consumername=consumer
            )
        except Exception as exc:  # no stream or no group yet: nothing pending
            if "NOGROUP" in str(exc):
                return {}
            raise
        return {row["message_id"]: row["consumer"] for row in rows}

    async def finished(self, *entry_ids: str) -> bool:
        """Each entry completed and its output published, and nothing of them pending."""
        held = await self.pending()
        for entry_id in entry_ids:
            kinds = [r.kind for r in await self.reports(entry_id) if not r.fenced]
            if entry_id in held or "WORK_COMPLETED" not in kinds or "WORK_PUBLISHED" not in kinds:
                return False
        return True

    async def dead_letters(self) -> dict[str, dict[str, str]]:
        """originalId -> the dead letter's fields."""
        return {fields["originalId"]: fields for _, fields in await self.redis.xrange(DLQ)}

    async def asked_for_dead_letter(self, entry_id: str) -> list[str]:
        """Who asked the conductor for the entry's dead letter (DEAD_LETTER), by consumer."""
        query = select(events.c.detail).where(
            events.c.kind == "DEAD_LETTERED", events.c.entry_id == entry_id
        )
        async with self.engine.connect() as conn:
            return [row.detail.get("askedBy") for row in await conn.execute(query)]

    async def lease_held(self, consumer: str) -> bool:
        return bool(await self.redis.exists(lease_key(AGENT_ID, STREAM, GROUP, consumer)))

    def stop_all(self) -> dict[str, int]:
        for agent in self.agents:
            agent.terminate()
        return {agent.consumer: agent.stop() for agent in self.agents}


# The `world` fixture: `async with world(**conductor settings) as w:`.
Opener = Callable[..., contextlib.AbstractAsyncContextManager[World]]


@contextlib.asynccontextmanager
async def conducted(
    world: World, redis_url: str, database_url: str, **env: str
) -> AsyncIterator[World]:
    """The world with a conductor serving, its agents reaped on the way out."""
    async with serve(redis_url, database_url, **conductor_env(**env)) as conductor:
        world.conductor = conductor
        try:
            yield world
        finally:
            for agent in world.agents:
                if agent.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        agent.process.send_signal(signal.SIGCONT)  # one a scenario stopped
            world.stop_all()
