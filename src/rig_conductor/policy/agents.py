"""Consumer name -> agent id, by the longest known agent id that prefixes the name.

Pure: stdlib and domain only.
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from rig_conductor.domain import AgentId, ConsumerName


def known_agents(*sources: Iterable[str]) -> frozenset[AgentId]:
    """The union of configured and heartbeat-seen agent ids, blanks dropped."""
    return frozenset(
        AgentId(agent.strip()) for source in sources for agent in source if agent.strip()
    )


def resolve_agent(consumer: ConsumerName, agents: Set[AgentId]) -> AgentId | None:
    """The longest agent id that equals `consumer` or is a prefix of it followed by `-`.

    `review-e-codex-rig-agent-runtime-0` resolves to `review-e-codex`, not `review-e`: walking the
    `-` positions from the right tries the longest candidates first, so the first hit wins.
    A wrong answer here silently judges one agent's consumers by another agent's heartbeats.
    """
    return AgentIndex(agents).resolve(consumer)


class AgentIndex:
    """`resolve_agent` for many consumers against one set of agents."""

    def __init__(self, agents: Set[AgentId]) -> None:
        self._agents = agents
        # No prefix can be longer than the longest agent id: the walk starts there.
        self._longest = max(map(len, agents), default=0)

    def resolve(self, consumer: ConsumerName) -> AgentId | None:
        whole = AgentId(consumer)
        if whole in self._agents:
            return whole
        end = min(len(consumer), self._longest + 1)
        while (end := consumer.rfind("-", 0, end)) > 0:
            prefix = consumer[:end]
            if prefix in self._agents:
                return AgentId(prefix)
        return None
