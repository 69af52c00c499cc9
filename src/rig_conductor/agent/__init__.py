"""The worker-side agent runtime: `run_agent(handler, ...)` and the `Entry` a handler gets.

A handler is `func(entry)`, plain or `async def`: returning means done, raising means failed
(the entry stays pending and is retried). Files written through `entry.stage(path)` appear at
`path` only once the conductor has accepted the attempt's completion.
"""

from rig_conductor.agent.runtime import (
    AgentError,
    ConsumerInUse,
    Entry,
    Handler,
    LeaseLost,
    run_agent,
)

__all__ = ["AgentError", "ConsumerInUse", "Entry", "Handler", "LeaseLost", "run_agent"]
