"""Consumer names: CONSUMER_ID, else HOSTNAME, else a UUID made at start; never a constant."""

from __future__ import annotations

import uuid

import pytest

from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.agent.entry import consumer_name, triage
from rig_conductor.agent.lease import lease_key


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"CONSUMER_ID": "dev-e-7f9c-xk2p1", "HOSTNAME": "node-1"}, "dev-e-7f9c-xk2p1"),
        ({"HOSTNAME": "dev-e-6f7b9c-xk2p1"}, "dev-e-6f7b9c-xk2p1"),
        ({"CONSUMER_ID": "  ", "HOSTNAME": "dev-e-0"}, "dev-e-0"),
        ({"CONSUMER_ID": " dev-e-1 "}, "dev-e-1"),
    ],
)
def test_the_pod_unique_name_wins(environ: dict[str, str], expected: str) -> None:
    assert consumer_name("dev-e", environ) == expected


def test_without_either_a_fresh_uuid_keeps_the_agent_id_as_prefix() -> None:
    first, second = consumer_name("dev-e", {}), consumer_name("dev-e", {"HOSTNAME": ""})
    assert first != second
    for name in (first, second):
        prefix, _, rest = name.partition("-e-")
        assert prefix == "dev" and uuid.UUID(rest)


def test_the_lease_key_names_stream_group_and_consumer_among_the_agents_keys() -> None:
    assert lease_key("dev-e", "rig:dispatch", "builders", "dev-e-0") == (
        "rig:agent:dev-e:lease:rig:dispatch:builders:dev-e-0"
    )


@pytest.mark.parametrize(
    ("agent", "prefix"),
    [
        ("dev-e", "rig:agent:dev-e:"),
        ("dev-e:x", "rig:agent:dev-e%3Ax:"),  # not under dev-e's pattern
        ("a*b?[c]", "rig:agent:a%2Ab%3F%5Bc%5D:"),  # no glob character in a pattern
        ("ü.b_c~d", "rig:agent:%C3%BC.b_c~d:"),
    ],
)
def test_an_agents_keys_are_under_its_percent_encoded_id(agent: str, prefix: str) -> None:
    assert redis_keys.agent_prefix(agent) == prefix
    assert lease_key(agent, "s", "g", "c").startswith(prefix)


@pytest.mark.parametrize(
    ("fields", "deliveries", "verdict"),
    [
        ({"issueId": "rc-1"}, 1, "handle"),  # first delivery
        ({"issueId": "rc-1"}, 5, "handle"),  # four before this read: under the limit of 5
        ({"issueId": "rc-1"}, 6, "max-deliveries"),  # five before this read
        ({"issueId": "rc-1"}, 9, "max-deliveries"),
        ({}, 1, "trimmed"),  # deleted or trimmed from the stream
        ({}, 9, "trimmed"),
    ],
)
def test_triage(fields: dict[str, str], deliveries: int, verdict: str) -> None:
    assert triage(fields, deliveries=deliveries, max_deliveries=5) == verdict
