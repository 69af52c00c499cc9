"""Blind spells: silence the conductor could not hear is not silence (reaper rule 3, docs/rules.md).

Every conductor that takes heartbeats in marks, about once a second, that it is listening: its
heartbeat writes reach PostgreSQL. The marks of all replicas are the `heard` spans of the
evidence. A stretch covered by no span (every replica stopped, PostgreSQL unreachable, heartbeat
writes failing) is a blind spell: nobody could have stored a heartbeat then, so it does not count
toward RIG_AGENT_DOWN_MS. An agent is down only after RIG_AGENT_DOWN_MS of time the conductor
could hear.

Kubernetes' node lifecycle controller makes the same call: when it cannot hear a whole zone, it
stops evicting, because the silence says more about itself than about the nodes.

Pure: stdlib and domain only, no clock; `now` comes with the evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from rig_conductor.domain import Span


def blind_spells(heard: Sequence[Span], *, now: datetime, slack_ms: int) -> tuple[Span, ...]:
    """The gaps between the `heard` spans up to `now`, oldest first.

    A replica still counts as hearing `slack_ms` after its last mark (marks come every second;
    the slack absorbs a slow one). Before the first span nothing is known, and nothing counts as
    blind: a database that never had a listening conductor has no heartbeats to discount. With
    no spans at all there are no spells.
    """
    if not heard:
        return ()
    slack = timedelta(milliseconds=slack_ms)
    spells: list[Span] = []
    spans = sorted(heard, key=lambda span: span.start)
    reach = spans[0].end + slack  # how far the spans seen so far cover
    for span in spans[1:]:
        if span.start > reach:
            spells.append(Span(reach, span.start))
        reach = max(reach, span.end + slack)
    if now > reach:
        spells.append(Span(reach, now))
    return tuple(spell for spell in spells if spell.start < min(spell.end, now))


def heard_cutoff(now: datetime, *, down_ms: int, spells: Sequence[Span]) -> datetime:
    """The instant after which a heartbeat is fresh: `down_ms` of heard time before `now`.

    Walks back from `now`, skipping the spells, until `down_ms` of time outside them has passed.
    Without spells it is `now - down_ms`; each spell inside that window moves it back by the
    spell's length (and a spell reached that way may pull in another).
    """
    remaining = timedelta(milliseconds=down_ms)
    at = now
    for spell in sorted(spells, key=lambda s: s.end, reverse=True):
        end = min(spell.end, at)
        if end <= spell.start:
            continue
        heard = at - end
        if heard >= remaining:
            break
        remaining -= heard
        at = min(spell.start, at)
    return at - remaining


def blind_ms(now: datetime, *, down_ms: int, spells: Sequence[Span]) -> int:
    """How much later than usual silence is judged: the blind time inside the window that decides
    who is down (0 when the conductor heard all of the last RIG_AGENT_DOWN_MS)."""
    window = now - heard_cutoff(now, down_ms=down_ms, spells=spells)
    return max(0, round(window.total_seconds() * 1000) - down_ms)
