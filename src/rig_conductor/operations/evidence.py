"""The evidence the reaper's rules judge on (rules 3 and 5, docs/rules.md), built in one place
for the scan, the views and every move by hand, from one source of pod evidence. It decides
nothing: `policy.liveness.Fleet` judges what it returns.

Imported by the reaper as well as by the API and the console, so it imports neither them nor
the runtime they share.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Protocol

from rig_conductor.adapters.postgres import queries
from rig_conductor.adapters.postgres.engine import Engine
from rig_conductor.domain import Evidence, Pods
from rig_conductor.settings import Settings


class PodSource(Protocol):
    """What Kubernetes says about the pods consumers are named after (`reaper.pods.PodEvidence`)."""

    async def listing(self) -> Pods:
        """The pods listed now, as a scan lists them: what a decision is taken on."""
        ...

    def known(self) -> Pods:
        """What the last list and the watch since said, without asking Kubernetes again."""
        ...


async def load(
    engine: Engine,
    settings: Settings,
    *,
    pods: Pods | None,
    consumers: Collection[str] | None,
    read_at: datetime | None = None,
) -> Evidence:
    """The heartbeats, listening spans and recent moves of the tenant, with `pods` (None:
    Kubernetes off) and PostgreSQL's `now()` to judge them at.

    `consumers`: the consumers whose own heartbeats are read (None: every one's); a consumer
    left out is judged as one that never heartbeated by its own name, so a caller names every
    consumer it judges. `read_at`: when the reading of Redis the evidence goes with began.
    """
    return await queries.load_evidence(
        engine,
        tenant=settings.tenant,
        configured_agents=settings.known_agents,
        down_ms=settings.agent_down_ms,
        pods=pods,
        read_at=read_at,
        consumers=consumers,
    )


async def for_move(
    engine: Engine, settings: Settings, pods: PodSource | None, *, consumers: Collection[str]
) -> Evidence:
    """The evidence a move by hand judges its target on (rule 5): the scan's own, on a pod list
    taken now, so a consumer missing from it is no target unless it heartbeats by its own name."""
    listing = await pods.listing() if pods is not None else None
    return await load(engine, settings, pods=listing, consumers=consumers)
