"""Consumer -> agent resolution: longest known agent id, equal or followed by `-`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy.agents import known_agents, resolve_agent

# The fleet of the source design: 13 agents, several sharing prefixes.
FLEET = known_agents(
    [
        "review-e",
        "review-e-codex",
        "review-e-claude",
        "dev-e",
        "dev-e-dotnet",
        "dev-e-node",
        "dev-e-python",
        "qa-e",
        "qa-e-playwright",
        "docs-e",
        "ops-e",
        "plan-e",
        "triage-e",
    ]
)


@pytest.mark.parametrize(
    ("consumer", "agent"),
    [
        ("review-e-codex-rig-agent-runtime-0", "review-e-codex"),
        ("review-e-claude-rig-agent-runtime-3", "review-e-claude"),
        ("review-e-rig-agent-runtime-0", "review-e"),
        ("dev-e-dotnet-6f7b9c-xk2p1", "dev-e-dotnet"),
        ("dev-e-node-rig-agent-runtime-1", "dev-e-node"),
        ("dev-e-rig-agent-runtime-0", "dev-e"),
        ("dev-e-6f7b9c-xk2p1", "dev-e"),
        ("qa-e-playwright-0", "qa-e-playwright"),
        ("qa-e-0", "qa-e"),
        ("triage-e", "triage-e"),  # equal to an agent id
        ("dev-e-dotnet", "dev-e-dotnet"),
        ("review-ex-0", None),  # a prefix must end at a '-'
        ("review", None),
        ("reviewer-e-0", None),
        ("unknown-agent-0", None),
        ("", None),
        ("-review-e", None),
    ],
)
def test_longest_known_prefix_wins(consumer: str, agent: str | None) -> None:
    assert resolve_agent(ConsumerName(consumer), FLEET) == agent


def test_known_agents_drops_blanks_and_merges_sources() -> None:
    assert known_agents(["a", " ", ""], {"b": 1}) == {"a", "b"}


names = st.text(alphabet="abc-", min_size=1, max_size=8)


@given(agents=st.frozensets(names, max_size=6), consumer=st.text(alphabet="abc-0", max_size=14))
def test_resolution_is_the_longest_matching_agent(agents: frozenset[str], consumer: str) -> None:
    fleet = frozenset(AgentId(a) for a in agents)
    matching = [a for a in fleet if consumer == a or consumer.startswith(a + "-")]
    expected = max(matching, key=len, default=None)
    assert resolve_agent(ConsumerName(consumer), fleet) == expected
