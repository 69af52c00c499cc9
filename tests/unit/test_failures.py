"""Whose fault a Redis error reply is, however redis-py or Redis wrapped it."""

from __future__ import annotations

import pytest
from redis.exceptions import ReadOnlyError, ResponseError

from rig_conductor.adapters import failures

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


SCRIPT = "Command # 1 (EVALSHA e810... 2 a:dlq a 1-0) of pipeline caused error: "
XADD = "Command # 1 (XADD s * a b) of pipeline caused error: "


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        (WRONGTYPE, "request"),
        (f"{WRONGTYPE} script: e810..., on @user_script:1.", "request"),  # Redis 7, in a script
        (f"Error running script (call to f_e810...): @user_script:1: {WRONGTYPE}", "request"),
        (f"{SCRIPT}('{WRONGTYPE}',)", "request"),
        (f"Command # 3 (XRANGE a:dlq 1-0 1-0) of pipeline caused error: {WRONGTYPE}", "request"),
        ("NOGROUP No such key 's' or consumer group 'g'", "request"),
        ("LOADING Redis is loading the dataset in memory", "unavailable"),
        (f"{XADD}('LOADING Redis is loading',)", "unavailable"),
        ("NOPERM User rig has no permissions to run the 'xadd' command", "refused"),
        (f"{XADD}('NOPERM no',)", "refused"),
    ],
)
def test_the_verdict_reads_the_reply_inside_any_wrapper(text: str, verdict: str) -> None:
    assert failures.judge(ResponseError(text)) == verdict


def test_a_busy_error_class_is_unavailable_whatever_it_says() -> None:
    assert failures.judge(ReadOnlyError("You can't write against a read only replica.")) == (
        "unavailable"
    )


def test_a_refused_request_carries_the_reply_without_the_wrapper() -> None:
    wrapped = f"Command # 1 (XRANGE a:dlq 1-0 1-0) of pipeline caused error: ('{WRONGTYPE}',)"
    with pytest.raises(failures.RefusedRequest) as caught, failures.named_by_request():
        raise ResponseError(wrapped)
    assert str(caught.value) == WRONGTYPE
