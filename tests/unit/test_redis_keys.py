"""Companion keys of a stream: unchanged on one server, in the stream's hash slot on a cluster."""

from __future__ import annotations

import pytest

from rig_conductor.adapters.redis import keys as redis_keys


@pytest.mark.parametrize(
    ("stream", "dlq"),
    [
        ("rig:dispatch", "{rig:dispatch}:dlq"),
        ("{orders}:new", "{orders}:new:dlq"),  # the stream's own tag decides its slot
        ("a{b}c", "a{b}c:dlq"),
        ("a{b", "{a{b}:dlq"),  # no closing brace: the whole name is hashed, and is the tag
    ],
)
def test_cluster_dead_letter_streams_share_the_stream_slot(stream: str, dlq: str) -> None:
    assert redis_keys.dlq_key(stream, clustered=True) == dlq
    assert redis_keys.dlq_key(stream) == f"{stream}:dlq"  # standalone and sentinel: as always


def test_dispatch_markers_follow_the_same_rule() -> None:
    assert redis_keys.dispatched_key("rig:dispatch", "k1") == "rig:dispatch:dispatched:k1"
    assert (
        redis_keys.dispatched_key("rig:dispatch", "k1", clustered=True)
        == "{rig:dispatch}:dispatched:k1"
    )
    assert redis_keys.dispatched_key("{t}:s", "k1", clustered=True) == "{t}:s:dispatched:k1"


def test_hash_tags_as_redis_cluster_reads_them() -> None:
    assert redis_keys.has_hash_tag("{user1000}.following")
    assert redis_keys.has_hash_tag("foo{bar}{zap}")
    assert not redis_keys.has_hash_tag("foo{}{bar}")  # the first { } pair is empty
    assert redis_keys.has_hash_tag("foo{{bar}}")  # the tag is "{bar"
    assert not redis_keys.has_hash_tag("plain")


def test_a_name_no_companion_can_share_a_slot_with_is_refused_on_a_cluster() -> None:
    with pytest.raises(redis_keys.BadStreamName, match="hash tag"):
        redis_keys.dlq_key("a}b{", clustered=True)
    with pytest.raises(redis_keys.BadStreamName, match="hash tag"):
        redis_keys.dlq_key("a{}b", clustered=True)  # an empty tag is no tag
    assert redis_keys.dlq_key("a}b{") == "a}b{:dlq"


def test_the_docs_show_the_users_redis_acl_prints() -> None:
    from pathlib import Path

    from rig_conductor import redis_rights

    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploying.md").read_text()
    for line in redis_rights.setuser_lines(
        streams=["rig:dispatch"],
        dispatch_stream="rig:dispatch",
        agent_ids=["builder"],
        clustered=False,
    ):
        assert f"\n{line}\n" in docs, line
