"""Whether Redis lost its data, and what each dispatch then needs. Pure: stdlib only.

The conductor keeps an epoch marker beside each dispatch stream in Redis and remembers it in
PostgreSQL. Redis that restarted without persistence, was flushed, or failed over to an empty
replica has no marker (or, once a conductor has set a new one, another than the one
remembered): everything it held since the last look is gone, streams, groups, pending lists and
idempotency markers alike. Then each unfinished dispatch is judged by its idempotency marker,
which holds the entry id the dispatch was last appended as.
"""

from __future__ import annotations

from typing import Literal

# first-sight: nothing remembered yet (a new install or a new stream): record, recover nothing.
# same: Redis holds what was remembered. lost: Redis lost its data since it was remembered.
Epoch = Literal["first-sight", "same", "lost"]

# keep: Redis holds the entry the dispatch is recorded as.
# append: Redis knows nothing of the dispatch: append it again (at most once, by its key).
# follow: someone appended it again already (another conductor, or the client's retry), but
#   the record still names the lost entry: it follows the marker, the lost entry is fenced.
Dispatch = Literal["keep", "append", "follow"]


def judge_epoch(*, in_redis: str | None, remembered: str | None) -> Epoch:
    """Redis's epoch marker against the one PostgreSQL remembers.

    A marker that differs is a loss too: a conductor found it missing, set a new one, and has
    not finished appending (or died before it could); whoever looks next finishes the job.
    """
    if remembered is None:
        return "first-sight"
    if in_redis == remembered:
        return "same"
    return "lost"


def judge_dispatch(*, recorded_entry: str, marker: str | None) -> Dispatch:
    """One unfinished dispatch after a loss: its recorded entry id against its marker."""
    if marker is None:
        return "append"
    if marker == recorded_entry:
        return "keep"
    return "follow"
