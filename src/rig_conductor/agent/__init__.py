"""The worker-side agent runtime: `run_agent(handler, ...)` and the `Entry` a handler gets.

A handler is `func(entry)`, plain or `async def`: returning means done, raising means failed
(the entry stays pending and is retried). Files written through `entry.stage(path)` appear at
`path` only once the conductor has accepted the attempt's completion. A long handler calls
`entry.progress()` to keep its entry; `Degraded` steps the agent back while it cannot serve.

The names below load on first use (PEP 562), so `rig-conductor` commands other than `agent`
do not pay for the runtime's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rig_conductor.agent.entry import Degraded, Entry, Fenced, Handler
    from rig_conductor.agent.lease import AgentError, ConsumerInUse, LeaseLost
    from rig_conductor.agent.process import run_agent

_HOMES = {
    "AgentError": "lease",
    "ConsumerInUse": "lease",
    "Degraded": "entry",
    "Entry": "entry",
    "Fenced": "entry",
    "Handler": "entry",
    "LeaseLost": "lease",
    "run_agent": "process",
}

__all__ = [
    "AgentError",
    "ConsumerInUse",
    "Degraded",
    "Entry",
    "Fenced",
    "Handler",
    "LeaseLost",
    "run_agent",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
