"""Who may speak for whom: the contract's rule for events sent with a bound credential.

An unbound token (`RIG_API_TOKENS`) is a trusted client and speaks for anyone. A bound one
speaks only for itself:
- an agent token (`RIG_AGENT_TOKENS`, agent A): HEARTBEAT with `agentId` A, naming no consumer
  or one that resolves to A by the longest known agent id (rule 2, docs/rules.md), WORK_* only as
  such a consumer. So `dev-e`'s token cannot speak for `dev-e-dotnet-rig-agent-runtime-0`: that
  consumer belongs to `dev-e-dotnet`, whose heartbeats would otherwise be forged.
- a pod's ServiceAccount token (TokenReview): the pod speaks as the consumer of its own name,
  and for the agent that name resolves to.

Pure: stdlib and domain only. The caller passes the index of known agents; the rule decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy.agents import AgentIndex


@dataclass(frozen=True, slots=True)
class Binding:
    """What a bound credential may speak for: an agent (an agent token) or a pod by name (a
    ServiceAccount token); exactly one of the two."""

    agent: AgentId | None = None
    pod: ConsumerName | None = None


def refusal(
    binding: Binding,
    *,
    agent_id: str,
    consumer: str | None,
    work: bool,
    index: AgentIndex,
) -> str | None:
    """Why `binding` may not send an event for `agent_id` as `consumer` (None: it may).

    `work` is true for WORK_* reports, which must name the consumer they come from.
    """
    if work and consumer is None:
        return "a bound credential must name its consumer in a work report"
    if binding.pod is not None:
        return _pod_refusal(binding.pod, agent_id, consumer, index)
    assert binding.agent is not None, "a binding names an agent or a pod"
    if agent_id != binding.agent:
        return f"this token speaks for agent {binding.agent!r} only, not {agent_id!r}"
    if consumer is not None:
        owner = index.resolve(ConsumerName(consumer))
        if owner != binding.agent:
            return (
                f"consumer {consumer!r} belongs to "
                f"{'no known agent' if owner is None else f'agent {owner!r}'}, "
                f"not {binding.agent!r}"
            )
    return None


def _pod_refusal(
    pod: ConsumerName, agent_id: str, consumer: str | None, index: AgentIndex
) -> str | None:
    if consumer is not None and consumer != pod:
        return f"pod {pod!r} speaks as consumer {pod!r} only, not {consumer!r}"
    owner = index.resolve(pod)
    if owner is None:
        return f"pod {pod!r} resolves to no known agent"
    if agent_id != owner:
        return f"pod {pod!r} speaks for agent {owner!r} only, not {agent_id!r}"
    return None
