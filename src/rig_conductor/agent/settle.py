"""Starting and finishing an entry: its attempt, the completion and its staged files'
publication, and the dead-letter path.

A completion reports the files its attempt staged; the conductor records them in the
transaction that accepts it. Only then are they renamed onto their paths (published), reported
published (WORK_PUBLISHED), and the entry XACKed, in that order. A crash anywhere in between
leaves the entry pending with its outputs recorded in PostgreSQL: whoever holds it next is
answered "done" with the outputs still to publish, and finishes the publish (`recover`).
A fenced attempt's files are discarded. Entries worn out by deliveries or trimmed from the
stream are dead-lettered by the conductor, asked over the API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.agent import staging
from rig_conductor.agent.conductor import (
    ConductorClient,
    ConductorRejected,
    ConductorUnavailable,
    FencedAnswer,
)

logger = logging.getLogger(__name__)

A = TypeVar("A")

# What `recover` says when the accepted outputs are found nowhere: the entry runs again.
REOPENED = "reopened"


class Settler:
    """Settles the entries of one consumer of one group: starts, completes, publishes,
    dead-letters."""

    def __init__(
        self,
        *,
        redis: AnyRedis,
        conductor: ConductorClient,
        stream: str,
        group: str,
        consumer: str,
        stop: asyncio.Event,
        on_conductor_down: Callable[[], None],
    ) -> None:
        self._redis = redis
        self._conductor = conductor
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self._stop = stop
        self._on_conductor_down = on_conductor_down

    async def start(
        self, entry_id: str, issue: str | None, reopened: str = ""
    ) -> int | tuple[str, int | None]:
        """WORK_STARTED: the attempt to run, or what became of the entry when there is none (a
        done entry is published and acked here; one whose outputs were lost runs again)."""
        answer = await self._ask(
            self._conductor.work_started(stream=self.stream, entry_id=entry_id, issue_id=issue),
            unanswered="conductor unreachable for WORK_STARTED",
            rejected="WORK_STARTED rejected",
        )
        if isinstance(answer, str):
            return answer, None
        if isinstance(answer, FencedAnswer):
            if answer.done and not reopened:
                outcome = await self.recover(entry_id, issue, answer)
                if REOPENED in outcome:
                    return await self.start(entry_id, issue, reopened=outcome)
                return outcome, answer.attempt
            return f"{answer.detail} (attempt {answer.attempt}, {answer.state}); not acked", None
        if reopened:
            logger.warning("Entry %s runs again: %s", entry_id, reopened)
        return answer.attempt

    async def dead_letter(
        self, entry_id: str, issue: str | None, reason: str
    ) -> tuple[str, int | None]:
        """Ask the conductor to dead-letter the entry (reaper step 7's copy, its stream and
        fields). An entry whose completion was accepted is published and acked instead."""
        answer = await self._ask(
            self._conductor.dead_letter(
                stream=self.stream, entry_id=entry_id, issue_id=issue, reason=reason
            ),
            unanswered="DEAD_LETTER not answered",
            rejected="DEAD_LETTER rejected",
        )
        if isinstance(answer, str):
            return answer, None
        if isinstance(answer, FencedAnswer):
            if answer.done:
                return await self.recover(entry_id, issue, answer), answer.attempt
            return f"left pending: dead letter refused ({answer.detail})", None
        return (
            f"dead-lettered ({reason}) to {answer.dlq_stream} after {answer.deliveries} deliveries",
            None,
        )

    async def _ask(self, request: Awaitable[A], *, unanswered: str, rejected: str) -> A | str:
        """The conductor's answer to `request`; or, when it gives none, why the entry is left
        pending (an unreachable conductor is reported down first)."""
        try:
            return await request
        except ConductorUnavailable as exc:
            self._on_conductor_down()
            return f"left pending: {unanswered} ({exc})"
        except ConductorRejected as exc:
            return f"left pending: {rejected} ({exc})"

    async def complete(
        self, entry_id: str, issue: str | None, attempt: int, files: Sequence[staging.StagedFile]
    ) -> str:
        """WORK_COMPLETED with the staged files; on acceptance their publication, then XACK."""
        if files:
            await asyncio.to_thread(staging.flush, files)
        try:
            answer = await self._conductor.work_completed(
                stream=self.stream,
                entry_id=entry_id,
                issue_id=issue,
                attempt=attempt,
                outputs=staging.outputs(files),
                until=self._stop,
            )
        except ConductorUnavailable as exc:
            # The conductor may have accepted it without our hearing: the files stay staged,
            # and whoever holds the entry next is told whether to publish them.
            return f"left pending: WORK_COMPLETED not answered ({exc}); staged files kept"
        except ConductorRejected as exc:
            await asyncio.to_thread(staging.discard, files)
            return f"left pending: WORK_COMPLETED rejected ({exc}); staged files discarded"
        if isinstance(answer, FencedAnswer) and not (answer.done and answer.attempt == attempt):
            await asyncio.to_thread(staging.discard, files)
            return (
                f"fenced at completion: attempt {answer.attempt} ({answer.state}) owns it; "
                "staged files discarded, not acked"
            )
        # Accepted; or this very attempt is done already: a retry whose first try the conductor
        # accepted before its answer was lost. Its files are the accepted ones.
        return "completed" + await self.publish(entry_id, issue, attempt, files)

    async def recover(self, entry_id: str, issue: str | None, answer: FencedAnswer) -> str:
        """The entry is done: attempt `answer.attempt` was accepted. Publish its outputs that are
        not published yet (a crash interrupted it), then ack. Safe beside the accepted process:
        publishing twice renames nothing twice. `REOPENED` in the answer: the outputs are found
        nowhere, so the completion was voided and the entry runs again."""
        try:
            files = staging.from_outputs(answer.outputs, attempt=answer.attempt)
        except ValueError as exc:
            logger.error("Refused the recorded outputs of %s: %s", entry_id, exc)
            return f"left pending: recorded outputs refused ({exc})"
        if not files:
            await self._redis.xack(self.stream, self.group, entry_id)
            return "already done: acked"
        return f"already done{await self.publish(entry_id, issue, answer.attempt, files)}"

    async def publish(
        self, entry_id: str, issue: str | None, attempt: int, files: Sequence[staging.StagedFile]
    ) -> str:
        """Rename the accepted attempt's files onto their paths, report them published, XACK.

        Without the report the entry stays pending: the record in PostgreSQL says the outputs
        are not published, and the next holder publishes them (renaming again is a no-op)."""
        committed = await asyncio.to_thread(staging.commit, files)
        if files:
            try:
                answer = await self._conductor.work_published(
                    stream=self.stream,
                    entry_id=entry_id,
                    issue_id=issue,
                    attempt=attempt,
                    missing=committed.lost,
                    until=self._stop,
                )
            except (ConductorUnavailable, ConductorRejected) as exc:
                return (
                    f"; outputs renamed: {committed.renamed}, "
                    f"WORK_PUBLISHED not recorded ({exc}); not acked"
                )
            if committed.lost:
                return (
                    f"; {REOPENED}: staged outputs found nowhere ({', '.join(committed.lost)}), "
                    f"so attempt {attempt} does not count ({_state(answer)})"
                )
            if isinstance(answer, FencedAnswer):
                return f"; outputs renamed, WORK_PUBLISHED refused ({answer.detail}); not acked"
            await asyncio.to_thread(
                staging.remove_leftovers, files, entry_id=entry_id, keep_attempt=attempt
            )
        await self._redis.xack(self.stream, self.group, entry_id)
        if not files:
            return ""
        return f"; staged files published: {committed.renamed} (already {committed.already})"


def _state(answer: object) -> str:
    if isinstance(answer, FencedAnswer):
        return f"{answer.state}: {answer.detail}"
    return "the entry runs again"
