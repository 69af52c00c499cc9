"""Finishing an entry: the completion's fencing and staged files, and the dead-letter path.

On WORK_COMPLETED's acceptance the staged files are renamed and the entry XACKed, in that
order, with an intent recorded first so a crash in between is recoverable; a fenced attempt's
files are discarded. Entries worn out by deliveries or trimmed from the stream are
dead-lettered exactly as the reaper does (its Lua, its stream, its fields).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from rig_conductor.adapters import redis_streams
from rig_conductor.adapters.redis_client import AnyRedis
from rig_conductor.agent import staging
from rig_conductor.agent.conductor import (
    ConductorClient,
    ConductorRejected,
    ConductorUnavailable,
    FencedAnswer,
)
from rig_conductor.domain import ConsumerName, EntryId, GroupName, PendingEntry, StreamKey


class Settler:
    """Settles the entries of one consumer of one group: completes, drops, dead-letters."""

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

    async def dead_letter(
        self, entry_id: str, issue: str | None, reason: str, deliveries: int
    ) -> tuple[str, int | None]:
        """Exactly as reaper step 7: the shared Lua copies it to `<stream>:dlq` and XACKs it,
        guarded by the entry still being pending for this consumer."""
        settled = await self.settle_staged(entry_id, issue, reason)
        if settled is not None:
            return settled
        entry = PendingEntry(EntryId(entry_id), ConsumerName(self.consumer), 0, deliveries)
        done = await redis_streams.dead_letter(
            self._redis,
            stream=StreamKey(self.stream),
            group=GroupName(self.group),
            entries=[entry],
            reason=reason,
        )
        if not done:
            return "skipped: no longer pending for this consumer", None
        return (
            f"dead-lettered ({reason}) to {redis_streams.dlq_key(StreamKey(self.stream))} "
            f"after {done[0].deliveries} deliveries",
            None,
        )

    async def settle_staged(
        self, entry_id: str, issue: str | None, reason: str
    ) -> tuple[str, int | None] | None:
        """Before dead-lettering an entry with a recorded staged commit, ask the conductor: if
        that commit was accepted, finish it instead. None: go ahead and dead-letter."""
        intents = await staging.load_intents(self._redis, stream=self.stream, entry_id=entry_id)
        if not intents:
            return None
        try:
            answer = await self._conductor.work_started(
                stream=self.stream, entry_id=entry_id, issue_id=issue
            )
        except (ConductorUnavailable, ConductorRejected) as exc:
            if isinstance(exc, ConductorUnavailable):
                self._on_conductor_down()
            return f"left pending: WORK_STARTED not answered ({exc})", None
        if isinstance(answer, FencedAnswer) and answer.done:
            return await self.recover(entry_id, answer.attempt), answer.attempt
        for files in intents.values():
            await asyncio.to_thread(staging.discard, files)
        await staging.forget(self._redis, stream=self.stream, entry_id=entry_id)
        if not isinstance(answer, FencedAnswer):
            with contextlib.suppress(ConductorUnavailable, ConductorRejected):
                await self._conductor.work_failed(
                    stream=self.stream,
                    entry_id=entry_id,
                    issue_id=issue,
                    attempt=answer.attempt,
                    error=f"dead-lettered ({reason}) without running",
                )
        return None

    async def complete(
        self, entry_id: str, issue: str | None, attempt: int, files: Sequence[staging.StagedFile]
    ) -> str:
        """WORK_COMPLETED; on acceptance the rename, XACK and the intent's removal, in that
        order. The intent is recorded first, so a crash after acceptance is recoverable."""
        if files:
            await asyncio.to_thread(staging.flush, files)
            await staging.record_intent(
                self._redis, stream=self.stream, entry_id=entry_id, attempt=attempt, files=files
            )
        try:
            answer = await self._conductor.work_completed(
                stream=self.stream,
                entry_id=entry_id,
                issue_id=issue,
                attempt=attempt,
                until=self._stop,
            )
        except ConductorUnavailable as exc:
            # The conductor may have accepted it without our hearing: keep the intent.
            return f"left pending: WORK_COMPLETED not answered ({exc}); staged files kept"
        except ConductorRejected as exc:
            await self.drop(entry_id, attempt, files)
            return f"left pending: WORK_COMPLETED rejected ({exc}); staged files discarded"
        if isinstance(answer, FencedAnswer) and not (answer.done and answer.attempt == attempt):
            await self.drop(entry_id, attempt, files)
            return (
                f"fenced at completion: attempt {answer.attempt} ({answer.state}) owns it; "
                "staged files discarded, not acked"
            )
        # Accepted; or this very attempt is done already: a retry whose first try the conductor
        # accepted before its answer was lost (it stopped, the connection broke). Its files are
        # the accepted ones: discarding them would lose the work.
        committed = await self.finish(entry_id, attempt, files)
        return "completed" + (f"; staged files committed: {committed.renamed}" if files else "")

    async def drop(self, entry_id: str, attempt: int, files: Sequence[staging.StagedFile]) -> None:
        await asyncio.to_thread(staging.discard, files)
        if files:
            await staging.forget_attempt(
                self._redis, stream=self.stream, entry_id=entry_id, attempt=attempt
            )

    async def recover(self, entry_id: str, attempt: int) -> str:
        """The entry is done (attempt `attempt` was accepted): finish that attempt's staged
        commit if a crash interrupted it, then ack. Safe to run beside the accepted process."""
        committed = await self.finish(entry_id, attempt, ())
        if committed.renamed:
            return f"already done; staged files of attempt {attempt} committed: {committed.renamed}"
        return "already done: acked"

    async def finish(
        self, entry_id: str, attempt: int, files: Sequence[staging.StagedFile]
    ) -> staging.Committed:
        """Commit the accepted attempt's files (`files`, this process's own; else its recorded
        intent), then XACK and forget the intents.

        Its own files are committed before Redis is asked anything: a Redis that fails now,
        or restarted empty (the entry and the intent gone with it, and the conductor appends
        no done dispatch again), would otherwise leave an accepted completion without its
        effect, for good."""
        committed = await asyncio.to_thread(staging.commit, files) if files else None
        intents = await staging.load_intents(self._redis, stream=self.stream, entry_id=entry_id)
        recorded = intents.pop(attempt, ())
        if committed is None:
            files = recorded
            committed = await asyncio.to_thread(staging.commit, files)
        for stale in intents.values():  # attempts that were never accepted
            await asyncio.to_thread(staging.discard, stale)
        await asyncio.to_thread(  # and attempts killed before they recorded an intent
            staging.remove_leftovers, files, entry_id=entry_id, keep_attempt=attempt
        )
        await self._redis.xack(self.stream, self.group, entry_id)
        await staging.forget(self._redis, stream=self.stream, entry_id=entry_id)
        return committed
