"""The worker-side agent runtime: `run_agent(handler, ...)` and the `Entry` a handler gets.

A handler is `func(entry)`, plain or `async def`: returning means done, raising means failed
(the entry stays pending and is retried). Files written through `entry.stage(path)` appear at
`path` only once the conductor has accepted the attempt's completion. A long handler calls
`entry.progress()` to keep its entry; `Degraded` steps the agent back while it cannot serve.
"""

from rig_conductor.agent.entry import Degraded, Entry, Fenced, Handler
from rig_conductor.agent.lease import AgentError, ConsumerInUse, LeaseLost
from rig_conductor.agent.process import run_agent

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
