"""Consumer names: CONSUMER_ID, else HOSTNAME, else a UUID made at start; never a constant."""

from __future__ import annotations

import uuid

import pytest

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


def test_the_lease_key_names_stream_group_and_consumer() -> None:
    assert lease_key("rig:dispatch", "builders", "dev-e-0") == (
        "rig:consumer:rig:dispatch:builders:dev-e-0"
    )


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
