"""When an owner's degraded run began: rule 3b (docs/rules.md), decided from the facts the
heartbeat tables keep.

Pure: stdlib and domain only.

The facts, per voice (the heartbeats naming one consumer; an agent's heartbeats naming no
consumer): the latest heartbeat's `degraded`, and since when every heartbeat of that voice has
reported it (`Heartbeat.status_since`), whatever the gaps between them. The intake records
them and decides nothing (migration 0019); what makes a run, and what breaks one, is here.
"""

from __future__ import annotations

from datetime import datetime

from rig_conductor.domain import Heartbeat


def voice(own: Heartbeat | None, agent: Heartbeat | None) -> Heartbeat | None:
    """The heartbeats that speak for a consumer on rule 3b: its own once it has heartbeated by
    name, else its agent's that name no consumer (None: neither was heard).

    `own`: the consumer's own latest heartbeat; `agent`: its agent's.
    """
    if own is not None:
        return own
    return agent.anonymous if agent is not None else None


def run_start(own: Heartbeat | None, agent: Heartbeat | None) -> datetime | None:
    """Receipt time of the first heartbeat of the unbroken degraded run that speaks for a
    consumer (`voice`); None when its latest heartbeat is healthy, or nothing was heard, or the
    run's start is not known.

    The run is the heartbeats of that voice since the last healthy one, all degraded: only a
    healthy heartbeat of the same voice breaks it (also one inside a batch, whose heartbeats
    share one receipt time). A silence does not: the rule counts heartbeats, and a silence long
    enough to matter is rule 3's (the owner is down, which outranks degraded) or one no
    conductor could hear. Nor does the other voice: an agent's consumers heartbeating healthy by
    name leave its run of heartbeats naming no consumer as it is, and the other way round.
    """
    speaker = voice(own, agent)
    if speaker is None or not speaker.degraded:
        return None
    return speaker.status_since
