"""The one check of stream entry ids, and whose fault a Redis error reply is."""

from __future__ import annotations

import pytest
from redis.exceptions import ReadOnlyError, ResponseError

from rig_conductor import domain
from rig_conductor.adapters import failures

TOP = 2**64 - 1


@pytest.mark.parametrize(
    "text", ["0-0", "1-1", "1700000000000-12", f"{TOP}-{TOP}", f"{'0' * 20}-0"]
)
def test_ids_redis_takes_pass(text: str) -> None:
    assert domain.entry_id(text) == text


@pytest.mark.parametrize(
    "text",
    [
        f"{TOP + 1}-0",
        f"0-{TOP + 1}",
        "62897778110416964515-160485",  # what the fuzzer found
        "99999999999999999999-99999999999999999999",
        "1-1\n",
        "\u0661-1",  # an Arabic-Indic digit: \\d in a pattern lets it through
        "1",
        "1-",
        "-1",
        "1-1-1",
        "*",
        "+",
        "(1-1",
        "",
        "123456789012345678901-0",
    ],
)
def test_ids_redis_refuses_fail_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match="is not a stream entry id"):
        domain.entry_id(text)


@pytest.mark.parametrize(
    ("error", "verdict"),
    [
        (ResponseError("Invalid stream ID specified as stream command argument"), "request"),
        (
            ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
            "request",
        ),
        (ResponseError("NOGROUP No such key 's' or consumer group 'g'"), "request"),
        (ReadOnlyError("You can't write against a read only replica."), "unavailable"),
        (ResponseError("LOADING Redis is loading the dataset in memory"), "unavailable"),
        (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), "unavailable"),
        (ResponseError("NOPERM this user has no permissions to run the 'xdel' command"), "refused"),
    ],
)
def test_a_redis_error_reply_is_judged_by_what_it_says(error: Exception, verdict: str) -> None:
    assert failures.judge(error) == verdict
