"""What the conductor heard of a live agent it reclaimed as down, for the report: the consumer's
and its agent's heard intervals (PostgreSQL's liveness history and the open interval in the
heartbeat tables), every replica's listening marks (reaper rule 3's heard time), the agent's own
log lines about its heartbeats and the conductor, the conductors' lines about their lives (start,
shutdown, leadership, blind spells, scans) and the soak's faults, over the RIG_AGENT_DOWN_MS and
more before the reclaim. A failed run then shows whether the agent's heartbeats stopped landing
before the reclaim, and what the conductor counted as heard meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from chaos_timeline import Fault, Happening, parse_line, render

# How far before the reclaim the story starts: RIG_AGENT_DOWN_MS and a blind spell or two.
LOOKBACK_S = 25.0

HEARD = """
SELECT 'interval', consumer, extract(epoch FROM heard_from), extract(epoch FROM heard_to), beats
FROM liveness WHERE tenant = %(tenant)s AND (consumer = %(consumer)s
                                            OR (consumer IS NULL AND agent_id = %(agent)s))
UNION ALL
SELECT 'open', consumer, extract(epoch FROM heard_since), extract(epoch FROM last_heartbeat_at),
       beats
FROM consumer_heartbeats WHERE tenant = %(tenant)s AND consumer = %(consumer)s
UNION ALL
SELECT 'open', NULL, extract(epoch FROM heard_since), extract(epoch FROM last_heartbeat_at), beats
FROM agent_heartbeats WHERE tenant = %(tenant)s AND agent_id = %(agent)s
"""
LISTENING = """
SELECT replica, extract(epoch FROM heard_from), extract(epoch FROM heard_to)
FROM listening WHERE tenant = %s AND heard_to >= to_timestamp(%s) AND heard_from <= to_timestamp(%s)
"""
# How far after it: whether the agent was heard again at once.
AFTER_S = 5.0
MESSAGE_CHARS = 200
# An agent's lines that say how its heartbeats and its conductor fared.
AGENT_WORDS = ("eartbeat", "onductor", "Degraded", "Abandoned")
# A conductor's lines about its own life; its dispatches and moves are elsewhere in the report.
CONDUCTOR_SKIPS = ("Dispatched ", "[StreamReclaim] Dead-lettered", "POST /api/")


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


async def hearing(
    db: Any,
    *,
    tenant: str,
    consumer: str,
    agent: str,
    reclaimed_at: float,
    log: str,
    conductors: Mapping[str, str],
    faults: Iterable[Fault],
) -> list[str]:
    """The rendered story of what was heard of `consumer` (of `agent`, whose process wrote `log`)
    before `reclaimed_at`; `conductors` are the conductors' logs by name."""
    since = reclaimed_at - LOOKBACK_S
    happenings: list[Happening] = []
    rows = await db.execute(HEARD, {"tenant": tenant, "consumer": consumer, "agent": agent})
    for kind, named, start, end, beats in await rows.fetchall():
        if start is None or float(end) < since or float(start) > reclaimed_at + AFTER_S:
            continue
        who = f"consumer {named}" if named else f"agent {agent} (heartbeats naming no consumer)"
        state = "open interval" if kind == "open" else "interval"
        text = f"{who} heard, {state} from {_clock(float(start))} to {_clock(float(end))}"
        happenings.append(Happening(float(start), "heard", f"{text}, {beats} beats"))
    rows = await db.execute(LISTENING, (tenant, since, reclaimed_at))
    for replica, start, end in await rows.fetchall():
        span = f"from {_clock(float(start))} to {_clock(float(end))}"
        happenings.append(Happening(float(start), "listening", f"{replica} marks listening {span}"))
        happenings.append(Happening(float(end), "listening", f"{replica} last mark ({span})"))
    happenings += _lines({consumer: log}, since, reclaimed_at, _about_agent)
    happenings += _lines(conductors, since, reclaimed_at, _about_conductor)
    happenings += [
        Happening(f.at, "soak", f.text) for f in faults if since <= f.at <= reclaimed_at + 1
    ]
    what = f"live agent reclaimed as down at {_clock(reclaimed_at)}"
    return render(f"hearing of {consumer}", what, sorted(happenings))


def _about_agent(message: str) -> bool:
    return any(word in message for word in AGENT_WORDS)


def _about_conductor(message: str) -> bool:
    return not any(message.startswith(skip) for skip in CONDUCTOR_SKIPS)


def _lines(
    logs: Mapping[str, str], since: float, until: float, keep: Callable[[str], bool]
) -> list[Happening]:
    found = []
    for name, text in logs.items():
        for line in text.splitlines():
            record = parse_line(line)
            if record is not None and since <= record[0] <= until + 1 and keep(record[1]):
                found.append(Happening(record[0], name, record[1][:MESSAGE_CHARS]))
    return found
