"""Rule 5's spread: recovered entries water-fill the targets by their pending counts."""

from __future__ import annotations

from collections import Counter

import pytest

from rig_conductor.domain import AgentId, ConsumerName
from rig_conductor.policy.liveness import TargetCandidate
from rig_conductor.policy.reclaim import Spread

DEAD = ConsumerName("dead-0")


def target(name: str, pending: int, age_ms: int = 1_000, degraded: bool = False) -> TargetCandidate:
    return TargetCandidate(ConsumerName(name), AgentId(name[0]), degraded, age_ms, pending)


def give(spread: Spread, count: int, **kwargs: bool) -> Counter[str]:
    """Hand out `count` entries of the dead owner, in pages of 7, as the scan does."""
    got: Counter[str] = Counter()
    while count:
        page = min(7, count)
        for t, n in spread.share(page, owner=DEAD, **kwargs):
            spread.took(t.consumer, n)
            got[t.consumer] += n
        count -= page
    return got


def test_300_over_3_idle_targets_end_100_each() -> None:
    spread = Spread([target("a", 0), target("b", 0), target("c", 0)])
    assert give(spread, 300) == {"a": 100, "b": 100, "c": 100}


@pytest.mark.parametrize(
    ("loads", "count", "expected"),
    [
        # A target already holding 100 gets fewer.
        ((100, 0, 0), 300, {"a": 34, "b": 133, "c": 133}),
        ((100, 0, 0), 150, {"b": 75, "c": 75}),
        ((10, 0, 5), 6, {"b": 6}),
        ((10, 0, 5), 16, {"b": 10, "c": 5, "a": 1}),
        # Uneven loads, within one entry per target of level.
        ((7, 3, 1), 10, {"b": 4, "c": 6}),
    ],
)
def test_uneven_starting_loads(
    loads: tuple[int, int, int], count: int, expected: dict[str, int]
) -> None:
    spread = Spread([target(n, load) for n, load in zip("abc", loads, strict=True)])
    got = give(spread, count)
    assert got == expected
    final = [load + got[n] for n, load in zip("abc", loads, strict=True)]
    receivers = [final[i] for i, n in enumerate("abc") if got[n]]
    assert max(receivers) - min(final) <= 1


def test_ties_go_to_the_freshest_evidence() -> None:
    spread = Spread([target("fresh", 0, age_ms=5), target("stale", 0, age_ms=9_000)])
    assert spread.share(1, owner=DEAD) == [(target("fresh", 0, age_ms=5), 1)]


def test_non_degraded_before_degraded_whatever_the_load() -> None:
    spread = Spread([target("busy", 500), target("sick", 0, degraded=True)])
    assert give(spread, 10) == {"busy": 10}
    only_sick = Spread([target("sick", 0, degraded=True)])
    assert give(only_sick, 3) == {"sick": 3}
    assert give(Spread([target("sick", 0, degraded=True)]), 3, healthy_only=True) == {}


def test_never_the_owner() -> None:
    spread = Spread([target("a", 0), target("b", 50)])
    assert spread.share(5, owner=ConsumerName("a")) == [(target("b", 50), 5)]
    assert Spread([target("a", 0)]).share(5, owner=ConsumerName("a")) == []


def test_what_the_guard_left_is_taken_back() -> None:
    spread = Spread([target("a", 0), target("b", 0)])
    [(first, n)] = spread.share(1, owner=DEAD)
    spread.took(first.consumer, n)
    spread.kept(first.consumer, n)  # XCLAIM moved nothing
    assert spread.share(1, owner=DEAD) == [(first, 1)]


def test_the_room_the_guard_left_is_filled_by_later_pages() -> None:
    spread = Spread([target("a", 0), target("b", 0), target("c", 0)])
    assert give(spread, 30) == {"a": 10, "b": 10, "c": 10}
    spread.kept(ConsumerName("b"), 4)  # 4 of b's 10 were acked or re-read meanwhile
    spread.kept(ConsumerName("c"), 0)  # all of c's moved
    assert give(spread, 7) == {"b": 5, "a": 1, "c": 1}  # b first, up to the level
    with pytest.raises(ValueError):
        spread.kept(ConsumerName("a"), -1)
    with pytest.raises(ValueError):
        spread.took(ConsumerName("a"), -1)
