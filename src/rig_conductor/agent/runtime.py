"""The worker-side runtime's loop: read a consumer group, run a handler per entry, report.

One entry at a time. Per entry: WORK_STARTED (the attempt), the handler (`handlers`), then
WORK_COMPLETED and the staged files' rename and XACK, or the dead-letter path (`settle`).
A handler that raises `Degraded` pauses all reading and flags the heartbeats; one past
RIG_ENTRY_DEADLINE_MS without progress is abandoned, and its entry left for the reaper. The
handler's own errors never stop the runtime; it does not decide reclaims (the reaper does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping

from redis.exceptions import RedisError, ResponseError

from rig_conductor.adapters.redis.client import AnyRedis
from rig_conductor.agent import settle, staging
from rig_conductor.agent.conductor import (
    ConductorClient,
    ConductorRejected,
    ConductorUnavailable,
    FencedAnswer,
    backoff,
    pause,
    retry,
)
from rig_conductor.agent.entry import (
    Degraded,
    Entry,
    Fenced,
    Handler,
    ProgressReporter,
    consumer_name,
    triage,
)
from rig_conductor.agent.handlers import HandlerResult, call_handler
from rig_conductor.agent.heartbeats import HeartbeatLoop
from rig_conductor.agent.lease import (
    AgentError,
    ConsumerInUse,
    ConsumerLease,
    LeaseLost,
    lease_key,
)
from rig_conductor.agent.reader import GroupReader
from rig_conductor.agent.settings import AgentSettings
from rig_conductor.agent.settle import Settler

logger = logging.getLogger(__name__)

BLOCK_MS = 1_000  # short, so SIGTERM and the periodic pending-list read stay prompt
SHUTDOWN_GRACE_S = 30.0
_ABANDONED_MEMORY = 1_000  # entries given up at their deadline, never run again here


class Agent:
    """Reads one group of one stream as one consumer; see the module docstring."""

    def __init__(
        self,
        handler: Handler,
        *,
        settings: AgentSettings,
        agent_id: str,
        group: str,
        stream: str,
        consumer: str,
        redis: AnyRedis,
        conductor: ConductorClient,
        start_id: str = "0",
        stop: asyncio.Event | None = None,
        shutdown_grace_s: float = SHUTDOWN_GRACE_S,
        block_ms: int = BLOCK_MS,
    ) -> None:
        self.handler = handler
        self.settings = settings
        self.agent_id = agent_id
        self.group = group
        self.stream = stream
        self.consumer = consumer
        self.start_id = start_id
        self.stop = stop or asyncio.Event()
        self._reader = GroupReader(redis, stream=stream, group=group, consumer=consumer)
        self._conductor = conductor
        self._grace_s = shutdown_grace_s
        self._block_ms = max(1, block_ms)
        self._abandon = asyncio.Event()
        self._lease = ConsumerLease(
            redis, key=lease_key(agent_id, stream, group, consumer), ttl_ms=settings.lease_ttl_ms
        )
        self._joined = False
        self._next_scan = 0.0  # monotonic time our own pending list is next read
        self._conductor_down = False
        self._heartbeats = HeartbeatLoop(
            lease=self._lease,
            beat=self._beat,
            interval_s=settings.heartbeat_interval_s,
            consumer=consumer,
            stop=self.stop,
        )
        self._current: str | None = None
        self._settler = Settler(
            redis=redis,
            conductor=conductor,
            stream=stream,
            group=group,
            consumer=consumer,
            stop=self.stop,
            on_conductor_down=self._lost_conductor,
        )
        # Self-fencing (Degraded): the reasons while degraded, and the end of the pause.
        self._degraded: list[str] = []
        self._paused_until = 0.0
        # Entries abandoned at their deadline: left for the reaper, never run here again.
        self._abandoned: deque[str] = deque(maxlen=_ABANDONED_MEMORY)

    def _lost_conductor(self) -> None:
        self._conductor_down = True

    def abandon(self) -> None:
        """Stop now: the entry in progress is left pending."""
        self.stop.set()
        self._abandon.set()

    async def run(self) -> None:
        """Until `stop` is set: then finish the current entry (bounded) and return."""
        if not await self._lease.acquire(until=self.stop):
            return
        try:
            await self._join_group()
            logger.info(
                "Agent %s reads %s as consumer %s of group %s",
                self.agent_id,
                self.stream,
                self.consumer,
                self.group,
            )
            if not await self._introduce():
                return
            beat = asyncio.create_task(self._heartbeats.run(), name="rig-agent-heartbeats")
            beat.add_done_callback(self._heartbeats.ended)
            work = asyncio.create_task(self._consume(), name="rig-agent-consume")
            try:
                await self._until_stopped(work)
            finally:
                self._heartbeats.close()
                for task in (work, beat):
                    task.cancel()  # no-op for a finished task
                await asyncio.gather(work, beat, return_exceptions=True)
        finally:
            await self._lease.release()
        if self._heartbeats.lease_lost:
            raise LeaseLost(
                f"consumer name {self.consumer} was taken over by another process "
                f"(lease {self._lease.key}); stopped"
            )
        logger.info("Agent %s stopped", self.agent_id)

    async def _until_stopped(self, work: asyncio.Task[None]) -> None:
        stopping = asyncio.create_task(self.stop.wait())
        try:
            await asyncio.wait({work, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not work.done():
            if self._current is not None:
                logger.info(
                    "Stopping: finishing entry %s (up to %.0fs)", self._current, self._grace_s
                )
            abandon = asyncio.create_task(self._abandon.wait())
            try:
                await asyncio.wait(
                    {work, abandon}, timeout=self._grace_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                abandon.cancel()
        if not work.done():
            logger.warning("Abandoned entry %s: it stays pending", self._current)
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return
        work.result()  # a crash of the loop itself surfaces here

    async def _join_group(self) -> None:
        await self._reader.join(self.start_id)
        self._joined = True

    async def _rejoin_group(self) -> None:
        """The group vanished (NOGROUP): create it again from id 0, whatever `--start-id` said,
        so nothing the conductor appends again after Redis lost its data is skipped; and this
        consumer again, so it is a reclaim target before it reads. Its pending list is gone
        with the group: whatever it held is dispatched again by the conductor."""
        await self._reader.join("0")
        self._joined = True

    async def _beat(self) -> None:
        await self._conductor.heartbeat(degraded=bool(self._degraded), reasons=self._degraded)

    async def _consume(self) -> None:
        """Own pending list at start and every RIG_SCAN_INTERVAL_S; new entries in between. A
        Redis error is retried with the agent's backoff (`retry`); a stop ends the loop."""
        while not self.stop.is_set():
            # `retry` raises only a failure begun after the stop: nothing is left to read then.
            with contextlib.suppress(RedisError):
                await retry(
                    self._read_step, retry_on=RedisError, log=self._read_failed, stop=self.stop
                )

    async def _read_step(self) -> None:
        """One step of the read loop: wait out the conductor or a self-fence, rejoin a lost
        group, read our own pending list when due, else new entries until it is."""
        if self._conductor_down:
            await self._await_conductor()
            self._next_scan = 0.0  # the entries left pending meanwhile come first
        elif self._paused_until > time.monotonic():
            # Self-fenced: read nothing at all, not even our own pending entries.
            await pause(self._paused_until - time.monotonic(), self.stop)
            self._next_scan = 0.0  # then our own pending entries first
        else:
            if not self._joined:
                await self._rejoin_group()
            if time.monotonic() >= self._next_scan:
                await self._read_pending()
                self._next_scan = time.monotonic() + self.settings.scan_interval_s
            else:
                until_scan_ms = int((self._next_scan - time.monotonic()) * 1000)
                await self._read_new(max(1, min(self._block_ms, until_scan_ms)))

    def _read_failed(self, exc: Exception, delay: float) -> None:
        if isinstance(exc, ResponseError) and str(exc).startswith("NOGROUP"):
            self._joined = False
            logger.warning(
                "Group %s of %s is gone (Redis lost its data: restarted empty, flushed, "
                "or failed over to an empty replica); creating it again from 0 in %.1fs",
                self.group,
                self.stream,
                delay,
            )
        else:
            logger.warning("Redis error while reading: %s; retrying in %.1fs", exc, delay)

    async def _read_pending(self) -> None:
        """This consumer's pending entries, reclaimed ones included, one at a time.

        Entries abandoned at their deadline are stepped over without a read (a read would count
        as a delivery and wear them out), and forgotten once the reaper has moved them away.
        """
        if self._abandoned:
            await self._forget_moved()
        cursor = "0"
        while not (self.stop.is_set() or self._conductor_down or self._paused()):
            if self._abandoned:
                cursor = await self._reader.cursor_skipping(self._abandoned, cursor)
                if cursor == "":
                    return
            batch = await self._reader.pending_after(cursor)
            if not batch:
                return
            for entry_id, fields in batch:
                await self._process(entry_id, fields)
                cursor = entry_id

    async def _forget_moved(self) -> None:
        mine = await self._reader.all_pending_ids()
        kept = [entry_id for entry_id in self._abandoned if entry_id in mine]
        self._abandoned.clear()
        self._abandoned.extend(kept)

    def _paused(self) -> bool:
        return self._paused_until > time.monotonic()

    async def _read_new(self, block_ms: int) -> None:
        for entry_id, fields in await self._reader.new(block_ms):
            await self._process(entry_id, fields)

    async def _introduce(self) -> bool:
        """Heartbeat by name before reading anything; False if stopped first.

        A consumer that holds entries must be one the conductor has heard of: a consumer that
        never heartbeated, of an agent whose other consumers do, could never be judged down, and
        its entries would stay pending forever.
        """

        async def heartbeat() -> bool:
            if self.stop.is_set():
                return False
            await self._conductor.heartbeat()
            return True

        def failed(exc: Exception, delay: float) -> None:
            logger.warning(
                "First heartbeat failed (%s): reading nothing until the conductor accepts "
                "one; retrying in %.1fs",
                exc,
                delay,
            )

        failures = (ConductorUnavailable, ConductorRejected)
        return await retry(heartbeat, retry_on=failures, log=failed, stop=self.stop)

    async def _await_conductor(self) -> None:
        """While the conductor is unreachable, read nothing: every read counts as a delivery and
        would wear entries out towards the dead-letter queue without running them.

        The failure that brought the agent here was the first: it waits before each heartbeat,
        and gives up at a stop once the heartbeat in flight has failed."""
        if self.stop.is_set():
            return

        async def answers() -> bool:
            try:
                await self._conductor.heartbeat()
            except ConductorUnavailable:
                if self.stop.is_set():
                    return False
                raise
            except ConductorRejected:
                pass  # it answers, if only to refuse
            return True

        await pause(backoff(1), self.stop)
        later = retry(
            answers,
            retry_on=ConductorUnavailable,
            stop=self.stop,
            delay=lambda exc, failures: backoff(failures + 1),
        )
        if await later:
            self._conductor_down = False
            logger.info("The conductor answers again; resuming")

    async def _process(self, entry_id: str, fields: Mapping[str, str]) -> None:
        if self.stop.is_set():
            logger.info("Entry %s left pending: shutting down", entry_id)
            return
        if entry_id in self._abandoned:
            return  # given up at its deadline: the reaper moves it (rule 4b, docs/rules.md)
        self._current = entry_id
        issue = fields.get("issueId")
        attempt: int | None = None
        try:
            outcome, attempt = await self._handle(entry_id, fields, issue)
        except RedisError as exc:
            outcome = f"left pending: Redis error: {exc}"
        except Exception as exc:  # a bug here must not stop the loop; the entry stays pending
            logger.exception("Unexpected error on entry %s", entry_id)
            outcome = f"left pending: {type(exc).__name__}: {exc}"
        finally:
            self._current = None
        logger.info(
            "Entry %s (issue %s, attempt %s): %s",
            entry_id,
            issue or "-",
            attempt if attempt is not None else "-",
            outcome,
            extra={
                "entryId": entry_id,
                "issueId": issue,
                "attempt": attempt,
                "outcome": outcome,
                "stream": self.stream,
                "group": self.group,
                "consumer": self.consumer,
            },
        )

    async def _handle(
        self, entry_id: str, fields: Mapping[str, str], issue: str | None
    ) -> tuple[str, int | None]:
        deliveries = await self._reader.deliveries(entry_id)
        if deliveries is None:
            return "skipped: no longer pending for this consumer", None
        verdict = triage(fields, deliveries=deliveries, max_deliveries=self.settings.max_deliveries)
        if verdict != "handle":
            outcome, attempt = await self._settler.dead_letter(entry_id, issue, verdict)
            if settle.REOPENED not in outcome:
                return outcome, attempt
            # The accepted outputs were lost: the completion is void, and this consumer holds
            # the attempt reserved to run it again, however often it was delivered.
            return await self._run(entry_id, dict(fields), issue, reopened=outcome)
        return await self._run(entry_id, dict(fields), issue)

    async def _run(
        self, entry_id: str, fields: dict[str, str], issue: str | None, reopened: str = ""
    ) -> tuple[str, int | None]:
        started = await self._settler.start(entry_id, issue, reopened)
        if isinstance(started, tuple):
            return started
        attempt = started
        area = staging.Staging(entry_id=entry_id, attempt=attempt)
        progress = self._reporter(entry_id, issue, attempt)
        entry = Entry(
            entry_id, self.stream, self.group, self.consumer, attempt, fields, area, progress
        )
        deadline_ms = self.settings.entry_deadline_ms
        result = await call_handler(
            self.handler,
            entry,
            progress=progress,
            deadline_s=deadline_ms / 1000 if deadline_ms else None,
        )
        files = area.close()
        if result.ok:
            if self._degraded:
                logger.info("Handler succeeded again: no longer degraded")
                self._degraded = []
            return await self._settler.complete(entry_id, issue, attempt, files), attempt
        await asyncio.to_thread(staging.discard, files)
        error = self._after_failure(entry_id, result)
        try:
            await self._conductor.work_failed(
                stream=self.stream, entry_id=entry_id, issue_id=issue, attempt=attempt, error=error
            )
        except (ConductorUnavailable, ConductorRejected) as exc:
            logger.warning("WORK_FAILED for %s not recorded: %s", entry_id, exc)
        if result.degraded is not None:
            with contextlib.suppress(ConductorUnavailable, ConductorRejected):
                await self._beat()  # the conductor's grace period starts now, not a beat later
        return f"failed, left pending: {error.splitlines()[0] if error else ''}", attempt

    def _after_failure(self, entry_id: str, result: HandlerResult) -> str:
        """Remember what a failed call means for what comes next; the error text to report."""
        if result.abandoned:
            self._abandoned.append(entry_id)
        if result.degraded is None:
            return result.error or ""
        degraded = result.degraded
        pause = degraded.pause_s()
        if degraded.reason not in self._degraded:
            self._degraded.append(degraded.reason)
        self._paused_until = time.monotonic() + pause
        logger.warning(
            "Degraded (%s): reading nothing for %.0fs; the entry stays pending",
            degraded.reason,
            pause,
        )
        return f"degraded: {degraded.reason}"

    def _reporter(self, entry_id: str, issue: str | None, attempt: int) -> ProgressReporter:
        async def send() -> bool:
            try:
                answer = await self._conductor.work_progress(
                    stream=self.stream, entry_id=entry_id, issue_id=issue, attempt=attempt
                )
            except (ConductorUnavailable, ConductorRejected) as exc:
                # Not recorded: the local deadline still counts it, the reaper may not.
                logger.warning("WORK_PROGRESS for %s not recorded: %s", entry_id, exc)
                return True
            return not isinstance(answer, FencedAnswer)

        return ProgressReporter(asyncio.get_running_loop(), send)


__all__ = [
    "Agent",
    "AgentError",
    "ConsumerInUse",
    "Degraded",
    "Entry",
    "Fenced",
    "Handler",
    "LeaseLost",
    "consumer_name",
]
