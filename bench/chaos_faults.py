"""The faults the chaos soak injects while issues flow, each counted in the soak's tally:

- agents SIGKILLed at random, each replaced by a new pod (a new consumer name);
- agents that exit by themselves replaced likewise (counted as crashes);
- on a schedule, one at a time, each once a share of the issues is done: the conductor
  restarted (SIGKILL and SIGTERM in turn), PostgreSQL stopped for a while then started, every
  conductor stopped for longer than RIG_AGENT_DOWN_MS then started while the agents keep
  running, and Redis restarted empty (SHUTDOWN NOSAVE, started again on the same port).

It judges nothing: the report (`chaos_report`) says what the faults did to the work.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from chaos_timeline import Fault

if TYPE_CHECKING:
    from chaos import Soak

logger = logging.getLogger("chaos")

# The schedule's faults fire between these shares of the issues done: not before work flows,
# and not so late that the last one meets an idle fleet.
FIRST_SHARE, LAST_SHARE = 0.1, 0.7


async def kill_agents(soak: Soak) -> None:
    while True:
        await asyncio.sleep(soak.opts.kill_every)
        slot = soak.rng.randrange(len(soak.slots))
        victim = soak.slots[slot]
        soak.faults.append(Fault(time.time(), f"SIGKILLed {victim.name}", victim.name))
        await victim.stop(signal.SIGKILL)
        soak.tally["agent kills"] += 1
        soak.slots[slot] = soak.start_worker(slot)
        logger.info("SIGKILLed %s, started %s", victim.name, soak.slots[slot].name)


async def watch_agents(soak: Soak) -> None:
    """An agent that exits on its own is a crash: count it and start a replacement. One the
    soak is killing is not: `kill_agents` replaces it."""
    while True:
        await asyncio.sleep(0.5)
        for slot, child in enumerate(soak.slots):
            if not child.alive() and not child.stopping:
                soak.tally["agent crashes"] += 1
                logger.warning("%s exited by itself (%s)", child.name, child.process.returncode)
                soak.slots[slot] = soak.start_worker(slot)


def plan(soak: Soak) -> list[str]:
    """The scheduled faults in the order they fire: the kinds taken in turn."""
    opts = soak.opts
    left = {"conductor restart": opts.conductor_restarts, "postgres outage": opts.postgres_outages}
    left |= {"conductor outage": opts.conductor_outages, "redis restart": opts.redis_restarts}
    order: list[str] = []
    while any(left.values()):
        for kind, n in left.items():
            if n:
                order.append(kind)
                left[kind] = n - 1
    return order


async def scheduled(soak: Soak) -> None:
    """Every fault of `plan` in turn, each once its share of the issues is done; then sets
    `soak.faults_over`."""
    faults: dict[str, Callable[[Soak, int], Awaitable[None]]] = {
        "conductor restart": restart_conductor,
        "postgres outage": postgres_outage,
        "conductor outage": conductor_outage,
        "redis restart": restart_redis,
    }
    order = plan(soak)
    for n, kind in enumerate(order):
        share = FIRST_SHARE + (LAST_SHARE - FIRST_SHARE) * n / max(1, len(order) - 1)
        while len(soak.done_everywhere()) < share * len(soak.issues):  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        await faults[kind](soak, order[: n + 1].count(kind))
        soak.faults_done += 1
    soak.faults_over.set()


async def restart_conductor(soak: Soak, n: int) -> None:
    sig = signal.SIGKILL if n % 2 else signal.SIGTERM
    soak.faults.append(Fault(time.time(), f"conductor restart {n}: {sig.name}"))
    code = await soak.conductors[-1].stop(sig)
    logger.info("Conductor stopped with %s (exit %s); restarting", sig.name, code)
    await asyncio.sleep(1.0)
    await soak.start_conductor()
    soak.faults.append(Fault(time.time(), f"conductor restart {n}: a conductor ready"))
    soak.tally["conductor restarts"] += 1


async def conductor_outage(soak: Soak, n: int) -> None:
    """Every conductor stopped (SIGTERM) for `--outage-s`, longer than RIG_AGENT_DOWN_MS: the
    agents keep running and retry their heartbeats."""
    stopped = [c for c in soak.conductors if c.alive()]
    soak.faults.append(Fault(time.time(), f"conductor outage {n}: every conductor stopped"))
    await asyncio.gather(*(c.stop(signal.SIGTERM) for c in stopped))
    began = time.monotonic()
    logger.info("Every conductor stopped (outage %d); starting one in %gs", n, soak.opts.outage_s)
    await asyncio.sleep(soak.opts.outage_s)
    await soak.start_conductor()
    soak.faults.append(Fault(time.time(), f"conductor outage {n} over: a conductor ready"))
    soak.tally["conductor outages"] += 1
    logger.info("Conductor outage %d over after %.1fs", n, time.monotonic() - began)


async def postgres_outage(soak: Soak, n: int) -> None:
    """PostgreSQL stopped (fast: sessions cut) for `--outage-s`, then started on its port."""
    began = time.monotonic()
    soak.faults.append(Fault(time.time(), f"PostgreSQL outage {n}: stopping"))
    await asyncio.to_thread(soak.postgres.stop)
    logger.info("PostgreSQL stopped (outage %d); starting it in %gs", n, soak.opts.outage_s)
    await asyncio.sleep(soak.opts.outage_s)
    await asyncio.to_thread(soak.postgres.start)
    soak.faults.append(Fault(time.time(), f"PostgreSQL outage {n} over: started"))
    soak.tally["postgres restarts"] += 1
    logger.info("PostgreSQL outage %d over after %.1fs", n, time.monotonic() - began)


async def restart_redis(soak: Soak, n: int) -> None:
    """Redis restarted empty: every stream, group, pending list and marker gone at once."""
    soak.faults.append(Fault(time.time(), f"Redis restart {n}: SHUTDOWN NOSAVE"))
    await asyncio.to_thread(soak.redis_server.restart_empty)
    soak.faults.append(Fault(time.time(), f"Redis restart {n}: started again, empty"))
    soak.tally["redis restarts"] += 1
    logger.info("Redis restarted empty (%d)", n)
