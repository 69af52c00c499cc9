"""Telling that Redis lost its data, and what each unfinished dispatch needs then
(`policy.redis_loss`): table tests, no servers."""

from __future__ import annotations

import pytest

from rig_conductor.policy import redis_loss


@pytest.mark.parametrize(
    ("in_redis", "remembered", "verdict"),
    [
        (None, None, "first-sight"),  # a new install: nothing to compare with
        ("e1", None, "first-sight"),  # a new tenant or stream beside a marker set by another
        ("e1", "e1", "same"),
        (None, "e1", "lost"),  # restarted empty, flushed, failed over to an empty replica
        ("e2", "e1", "lost"),  # lost, and a conductor set a new marker but did not finish
    ],
)
def test_the_epoch_marker_tells_a_loss(
    in_redis: str | None, remembered: str | None, verdict: str
) -> None:
    assert redis_loss.judge_epoch(in_redis=in_redis, remembered=remembered) == verdict


@pytest.mark.parametrize(
    ("marker", "action"),
    [
        ("5-0", "keep"),  # Redis holds the entry it is recorded as (dispatched since the loss)
        (None, "append"),  # lost with everything else
        ("9-0", "follow"),  # appended again already (another conductor, a client's retry)
    ],
)
def test_each_unfinished_dispatch_by_its_marker(marker: str | None, action: str) -> None:
    assert redis_loss.judge_dispatch(recorded_entry="5-0", marker=marker) == action
