"""Who may speak for whom (contract), as a table over the pure rule."""

from __future__ import annotations

import pytest

from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy.agents import AgentIndex
from rig_conductor.policy.speaking import Binding, refusal

INDEX = AgentIndex(frozenset(map(AgentId, ["dev-e", "dev-e-dotnet", "review-e"])))
DEV_E = Binding(agent=AgentId("dev-e"))
POD = Binding(pod=ConsumerName("dev-e-dotnet-rig-agent-runtime-0"))


@pytest.mark.parametrize(
    ("binding", "agent_id", "consumer", "work", "allowed"),
    [
        # An agent token: its own agent id, no consumer or one of its own.
        (DEV_E, "dev-e", None, False, True),
        (DEV_E, "dev-e", "dev-e", False, True),
        (DEV_E, "dev-e", "dev-e-rig-agent-runtime-0", False, True),
        (DEV_E, "dev-e", "dev-e-rig-agent-runtime-0", True, True),
        # ... never another agent, nor a consumer the longest known prefix gives to another.
        (DEV_E, "review-e", None, False, False),
        (DEV_E, "dev-e", "dev-e-dotnet-rig-agent-runtime-0", False, False),
        (DEV_E, "dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-0", False, False),
        (DEV_E, "dev-e", "review-e-0", True, False),
        (DEV_E, "dev-e", "stranger-0", False, False),
        # A work report must say which consumer sends it.
        (DEV_E, "dev-e", None, True, False),
        # A pod: as the consumer of its own name, for the agent that name resolves to.
        (POD, "dev-e-dotnet", None, False, True),
        (POD, "dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-0", False, True),
        (POD, "dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-0", True, True),
        (POD, "dev-e", "dev-e-dotnet-rig-agent-runtime-0", False, False),
        (POD, "dev-e-dotnet", "dev-e-dotnet-rig-agent-runtime-1", False, False),
        (POD, "dev-e-dotnet", None, True, False),
        (Binding(pod=ConsumerName("stranger-0")), "stranger", None, False, False),
    ],
)
def test_a_bound_credential_speaks_only_for_itself(
    binding: Binding, agent_id: str, consumer: str | None, work: bool, allowed: bool
) -> None:
    reason = refusal(binding, agent_id=agent_id, consumer=consumer, work=work, index=INDEX)
    assert (reason is None) is allowed, reason


def test_a_refusal_names_what_the_credential_may_speak_for() -> None:
    reason = refusal(
        DEV_E,
        agent_id="dev-e",
        consumer="dev-e-dotnet-rig-agent-runtime-0",
        work=False,
        index=INDEX,
    )
    assert reason is not None and "'dev-e-dotnet'" in reason and "'dev-e'" in reason
