"""The TypeScript runtime's table of start-up permission probes
(`clients/typescript/test/access-probes.json`, which its `npm test` checks the TypeScript code
against) says what `adapters.redis.access` runs for an agent: the two runtimes ask Redis the same
questions, so one user passes both or neither."""

from __future__ import annotations

import json
from pathlib import Path

from rig_conductor.adapters.redis import access as redis_access
from rig_conductor.adapters.redis import keys as redis_keys

TABLE = json.loads(
    (Path(__file__).resolve().parents[2] / "clients/typescript/test/access-probes.json").read_text()
)


def test_the_agents_probes() -> None:
    own = redis_keys.agent_prefix(TABLE["agentId"]) + "rig-access-probe"
    assert own == TABLE["own"]
    probes = redis_access._agent_probes(TABLE["stream"], own)
    assert [list(probe) for probe in probes] == TABLE["probes"]


def test_the_probe_key_the_over_privileged_check_writes_to() -> None:
    for case in TABLE["probeKey"]:
        assert redis_access.probe_key(case["stream"], clustered=case["clustered"]) == case["key"]
