"""The worker-side runtime: read a consumer group, run a handler per entry, report, ack.

One entry at a time. Per entry: WORK_STARTED (the attempt), the handler, WORK_COMPLETED, and only
on acceptance the staged files' rename and the XACK. Entries worn out by deliveries or trimmed
from the stream are dead-lettered exactly as the reaper does. The handler's own errors never
stop the runtime; it does not decide reclaims (the conductor's reaper does).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from rig_conductor.adapters import redis_streams
from rig_conductor.agent import staging
from rig_conductor.agent.conductor import (
    ConductorClient,
    ConductorRejected,
    ConductorUnavailable,
    Fenced,
    backoff,
)
from rig_conductor.agent.settings import AgentSettings, load_agent_settings
from rig_conductor.domain import ConsumerName, EntryId, GroupName, PendingEntry, StreamKey

logger = logging.getLogger(__name__)

BLOCK_MS = 1_000  # short, so SIGTERM and the periodic pending-list read stay prompt
SHUTDOWN_GRACE_S = 30.0
_PAUSE_MAX_S = 10.0


@dataclass(frozen=True)
class Entry:
    """One stream entry as a handler sees it, for one attempt."""

    id: str
    stream: str
    group: str
    consumer: str
    attempt: int
    fields: dict[str, str]
    _staging: staging.Staging | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._staging is None:
            area = staging.Staging(entry_id=self.id, attempt=self.attempt)
            object.__setattr__(self, "_staging", area)

    @property
    def issue_id(self) -> str | None:
        return self.fields.get("issueId")

    def stage(self, path: str | os.PathLike[str]) -> Path:
        """A temporary path beside `path` to write to; renamed onto `path` once the conductor
        accepts this attempt's completion, removed if the attempt is fenced off or fails."""
        assert self._staging is not None
        return self._staging.stage(path)


Handler = Callable[[Entry], Any]


class AgentError(Exception):
    """The agent cannot start or has to stop; the message is one line for the operator."""


class ConsumerInUse(AgentError):
    """Another live process reads with the same consumer name."""


class LeaseLost(AgentError):
    """Another process took the consumer name over while this one ran."""


def consumer_name(agent_id: str, environ: Mapping[str, str] | None = None) -> str:
    """CONSUMER_ID, else HOSTNAME (the pod name), else `<agent-id>-<uuid>` made now.

    Never a constant: two processes sharing a name would share one pending list. The UUID
    fallback keeps the agent id as a prefix, so the reaper can resolve it to its agent.
    """
    env = os.environ if environ is None else environ
    for variable in ("CONSUMER_ID", "HOSTNAME"):
        value = env.get(variable, "").strip()
        if value:
            return value
    return f"{agent_id}-{uuid.uuid4()}"


Triage = Literal["trimmed", "max-deliveries", "handle"]


def triage(fields: Mapping[str, str], *, deliveries: int, max_deliveries: int) -> Triage:
    """What to do with an entry just read. `deliveries` counts the read that returned it.

    An entry with no fields was deleted or trimmed from the stream (Redis still lists it as
    pending). Otherwise the count before this read decides, as the reaper's rule does.
    """
    if not fields:
        return "trimmed"
    if deliveries - 1 >= max_deliveries:
        return "max-deliveries"
    return "handle"


# Renew the lease only while this instance holds it; take it again if it expired meanwhile.
_RENEW_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def lease_key(stream: str, group: str, consumer: str) -> str:
    return f"rig:consumer:{stream}:{group}:{consumer}"


class ConsumerLease:
    """A Redis key that says "this consumer name is in use", kept alive with the heartbeats."""

    def __init__(self, client: Redis, *, key: str, ttl_ms: int, poll_s: float = 0.1) -> None:
        self.key = key
        self.instance = uuid.uuid4().hex
        self._client = client
        self._ttl_ms = ttl_ms
        self._poll_s = poll_s

    async def acquire(self, until: asyncio.Event | None = None) -> bool:
        """Take the name. A holder whose key expires was a dead predecessor (a restarted pod);
        a holder that renews meanwhile is alive, and this process must not start.

        False when `until` was set while waiting.
        """
        first: str | None = None
        last_ttl: int | None = None
        deadline: float | None = None
        while until is None or not until.is_set():
            if await self._client.set(self.key, self.instance, nx=True, px=self._ttl_ms):
                return True
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.get(self.key)
                pipe.pttl(self.key)
                holder, ttl = await pipe.execute()
            if holder is None:
                continue
            if first is None:
                first, deadline = holder, time.monotonic() + max(ttl, 0) / 1000 + 1.0
                logger.info(
                    "Consumer name lease %s is held by instance %s for %d ms more; waiting",
                    self.key,
                    holder,
                    ttl,
                )
            renewed = last_ttl is not None and ttl > last_ttl + 50
            assert deadline is not None
            if holder != first or renewed or time.monotonic() > deadline:
                raise ConsumerInUse(
                    f"consumer name in use by another live process (lease {self.key} renewed "
                    f"by instance {holder}); give each process its own CONSUMER_ID"
                )
            last_ttl = ttl
            await asyncio.sleep(self._poll_s)
        return False

    async def renew(self) -> bool:
        """False when another instance holds the name now."""
        held = await self._client.eval(_RENEW_LUA, 1, self.key, self.instance, self._ttl_ms)
        return bool(held)

    async def release(self) -> None:
        with contextlib.suppress(RedisError):
            await self._client.eval(_RELEASE_LUA, 1, self.key, self.instance)


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
        redis: Redis,
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
        self._redis = redis
        self._conductor = conductor
        self._grace_s = shutdown_grace_s
        self._block_ms = max(1, block_ms)
        self._abandon = asyncio.Event()
        self._lease = ConsumerLease(
            redis, key=lease_key(stream, group, consumer), ttl_ms=settings.lease_ttl_ms
        )
        self._lease_lost = False
        self._joined = False
        self._conductor_down = False
        self._current: str | None = None

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
            beat = asyncio.create_task(self._heartbeats(), name="rig-agent-heartbeats")
            work = asyncio.create_task(self._consume(), name="rig-agent-consume")
            try:
                await self._until_stopped(work)
            finally:
                for task in (work, beat):
                    task.cancel()  # no-op for a finished task
                await asyncio.gather(work, beat, return_exceptions=True)
        finally:
            await self._lease.release()
        if self._lease_lost:
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
        """Create the group lazily (BUSYGROUP is fine), then register this consumer, so it is a
        reclaim target before it has read anything."""
        try:
            await self._redis.xgroup_create(
                self.stream, self.group, id=self.start_id, mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        else:
            logger.info("Created group %s on %s from %s", self.group, self.stream, self.start_id)
        await self._redis.xgroup_createconsumer(self.stream, self.group, self.consumer)
        self._joined = True

    async def _heartbeats(self) -> None:
        """Renew the consumer-name lease and heartbeat, every RIG_HEARTBEAT_INTERVAL_S."""
        while True:
            try:
                if not await self._lease.renew():
                    logger.error(
                        "Consumer name %s is held by another process now; stopping", self.consumer
                    )
                    self._lease_lost = True
                    self.stop.set()
                    return
            except RedisError as exc:
                logger.warning("Could not renew the consumer-name lease: %s", exc)
            interval = self.settings.heartbeat_interval_s
            try:
                # Bounded, so a hanging conductor never delays the lease past its lifetime.
                async with asyncio.timeout(interval):
                    await self._conductor.heartbeat()
            except (ConductorUnavailable, ConductorRejected) as exc:
                logger.warning("Heartbeat failed: %s", exc)
            except TimeoutError:
                logger.warning("Heartbeat failed: no answer within %.1fs", interval)
            await asyncio.sleep(interval)

    async def _consume(self) -> None:
        """Own pending list at start and every RIG_SCAN_INTERVAL_S; new entries in between."""
        next_scan = 0.0
        failures = 0
        while not self.stop.is_set():
            try:
                if self._conductor_down:
                    await self._await_conductor()
                    next_scan = 0.0  # the entries left pending meanwhile come first
                    continue
                if not self._joined:
                    await self._join_group()
                if time.monotonic() >= next_scan:
                    await self._read_pending()
                    next_scan = time.monotonic() + self.settings.scan_interval_s
                    continue
                until_scan_ms = int((next_scan - time.monotonic()) * 1000)
                await self._read_new(max(1, min(self._block_ms, until_scan_ms)))
                failures = 0
            except RedisError as exc:
                failures += 1
                if isinstance(exc, ResponseError) and str(exc).startswith("NOGROUP"):
                    self._joined = False
                delay = backoff(failures)
                logger.warning("Redis error while reading: %s; retrying in %.1fs", exc, delay)
                await self._sleep(delay)

    async def _read_pending(self) -> None:
        """`XREADGROUP ... 0`: this consumer's pending entries, reclaimed ones included.

        One at a time: a read counts as a delivery, so only entries about to be handled are read.
        """
        cursor = "0"
        while not self.stop.is_set() and not self._conductor_down:
            reply = await self._redis.xreadgroup(
                self.group, self.consumer, {self.stream: cursor}, count=1
            )
            batch = _entries(reply)
            if not batch:
                return
            for entry_id, fields in batch:
                await self._process(entry_id, fields)
                cursor = entry_id

    async def _read_new(self, block_ms: int) -> None:
        reply = await self._redis.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=1, block=block_ms
        )
        for entry_id, fields in _entries(reply):
            await self._process(entry_id, fields)

    async def _introduce(self) -> bool:
        """Heartbeat by name before reading anything; False if stopped first.

        A consumer that holds entries must be one the conductor has heard of: a consumer that
        never heartbeated, of an agent whose other consumers do, could never be judged down, and
        its entries would stay pending forever.
        """
        attempt = 0
        while not self.stop.is_set():
            try:
                await self._conductor.heartbeat()
                return True
            except (ConductorUnavailable, ConductorRejected) as exc:
                attempt += 1
                delay = min(backoff(attempt), _PAUSE_MAX_S)
                logger.warning(
                    "First heartbeat failed (%s): reading nothing until the conductor accepts "
                    "one; retrying in %.1fs",
                    exc,
                    delay,
                )
                await self._sleep(delay)
        return False

    async def _await_conductor(self) -> None:
        """While the conductor is unreachable, read nothing: every read counts as a delivery and
        would wear entries out towards the dead-letter queue without running them."""
        attempt = 0
        while not self.stop.is_set():
            attempt += 1
            await self._sleep(min(backoff(attempt), _PAUSE_MAX_S))
            try:
                await self._conductor.heartbeat()
            except ConductorUnavailable:
                continue
            except ConductorRejected:
                pass
            self._conductor_down = False
            logger.info("The conductor answers again; resuming")
            return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _process(self, entry_id: str, fields: Mapping[str, str]) -> None:
        if self.stop.is_set():
            logger.info("Entry %s left pending: shutting down", entry_id)
            return
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
        deliveries = await self._deliveries(entry_id)
        if deliveries is None:
            return "skipped: no longer pending for this consumer", None
        verdict = triage(fields, deliveries=deliveries, max_deliveries=self.settings.max_deliveries)
        if verdict != "handle":
            return await self._dead_letter(entry_id, issue, verdict, deliveries)
        return await self._run(entry_id, dict(fields), issue)

    async def _deliveries(self, entry_id: str) -> int | None:
        rows = await self._redis.xpending_range(
            self.stream,
            self.group,
            min=entry_id,
            max=entry_id,
            count=1,
            consumername=self.consumer,
            idle=0,
        )
        return int(rows[0]["times_delivered"]) if rows else None

    async def _dead_letter(
        self, entry_id: str, issue: str | None, reason: str, deliveries: int
    ) -> tuple[str, int | None]:
        """Exactly as reaper step 7: the shared Lua copies it to `<stream>:dlq` and XACKs it,
        guarded by the entry still being pending for this consumer."""
        settled = await self._settle_staged(entry_id, issue, reason)
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

    async def _settle_staged(
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
            self._conductor_down = isinstance(exc, ConductorUnavailable)
            return f"left pending: WORK_STARTED not answered ({exc})", None
        if isinstance(answer, Fenced) and answer.done:
            return await self._recover(entry_id, answer.attempt), answer.attempt
        for files in intents.values():
            await asyncio.to_thread(staging.discard, files)
        await staging.forget(self._redis, stream=self.stream, entry_id=entry_id)
        if not isinstance(answer, Fenced):
            with contextlib.suppress(ConductorUnavailable, ConductorRejected):
                await self._conductor.work_failed(
                    stream=self.stream,
                    entry_id=entry_id,
                    issue_id=issue,
                    attempt=answer.attempt,
                    error=f"dead-lettered ({reason}) without running",
                )
        return None

    async def _run(
        self, entry_id: str, fields: dict[str, str], issue: str | None
    ) -> tuple[str, int | None]:
        try:
            answer = await self._conductor.work_started(
                stream=self.stream, entry_id=entry_id, issue_id=issue
            )
        except ConductorUnavailable as exc:
            self._conductor_down = True
            return f"left pending: conductor unreachable for WORK_STARTED ({exc})", None
        except ConductorRejected as exc:
            return f"left pending: WORK_STARTED rejected ({exc})", None
        if isinstance(answer, Fenced):
            if answer.done:
                return await self._recover(entry_id, answer.attempt), answer.attempt
            return f"{answer.detail} (attempt {answer.attempt}, {answer.state}); not acked", None
        attempt = answer.attempt
        area = staging.Staging(entry_id=entry_id, attempt=attempt)
        entry = Entry(entry_id, self.stream, self.group, self.consumer, attempt, fields, area)
        error = await self._call_handler(entry)
        files = area.close()
        if error is not None:
            await asyncio.to_thread(staging.discard, files)
            try:
                await self._conductor.work_failed(
                    stream=self.stream,
                    entry_id=entry_id,
                    issue_id=issue,
                    attempt=attempt,
                    error=error,
                )
            except (ConductorUnavailable, ConductorRejected) as exc:
                logger.warning("WORK_FAILED for %s not recorded: %s", entry_id, exc)
            return f"failed, left pending: {error.splitlines()[0] if error else ''}", attempt
        return await self._complete(entry_id, issue, attempt, files), attempt

    async def _call_handler(self, entry: Entry) -> str | None:
        """Run the handler; the error text when it raised, None when it returned."""
        try:
            if _is_async(self.handler):
                await self.handler(entry)
            else:
                result = await _in_daemon_thread(self.handler, entry)
                if inspect.isawaitable(result):
                    await result
        except Exception as exc:
            logger.warning("Handler raised on entry %s", entry.id, exc_info=True)
            return f"{type(exc).__name__}: {exc}"
        return None

    async def _complete(
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
                until=self.stop,
            )
        except ConductorUnavailable as exc:
            # The conductor may have accepted it without our hearing: keep the intent.
            return f"left pending: WORK_COMPLETED not answered ({exc}); staged files kept"
        except ConductorRejected as exc:
            await self._drop(entry_id, attempt, files)
            return f"left pending: WORK_COMPLETED rejected ({exc}); staged files discarded"
        if isinstance(answer, Fenced):
            await self._drop(entry_id, attempt, files)
            return (
                f"fenced at completion: attempt {answer.attempt} ({answer.state}) owns it; "
                "staged files discarded, not acked"
            )
        committed = await self._finish(entry_id, attempt, files)
        return "completed" + (f"; staged files committed: {committed.renamed}" if files else "")

    async def _drop(self, entry_id: str, attempt: int, files: Sequence[staging.StagedFile]) -> None:
        await asyncio.to_thread(staging.discard, files)
        if files:
            await staging.forget_attempt(
                self._redis, stream=self.stream, entry_id=entry_id, attempt=attempt
            )

    async def _recover(self, entry_id: str, attempt: int) -> str:
        """The entry is done (attempt `attempt` was accepted): finish that attempt's staged
        commit if a crash interrupted it, then ack. Safe to run beside the accepted process."""
        committed = await self._finish(entry_id, attempt, ())
        if committed.renamed:
            return f"already done; staged files of attempt {attempt} committed: {committed.renamed}"
        return "already done: acked"

    async def _finish(
        self, entry_id: str, attempt: int, files: Sequence[staging.StagedFile]
    ) -> staging.Committed:
        intents = await staging.load_intents(self._redis, stream=self.stream, entry_id=entry_id)
        files = intents.pop(attempt, ()) or files
        committed = await asyncio.to_thread(staging.commit, files)
        for stale in intents.values():  # attempts that were never accepted
            await asyncio.to_thread(staging.discard, stale)
        await asyncio.to_thread(  # and attempts killed before they recorded an intent
            staging.remove_leftovers, files, entry_id=entry_id, keep_attempt=attempt
        )
        await self._redis.xack(self.stream, self.group, entry_id)
        await staging.forget(self._redis, stream=self.stream, entry_id=entry_id)
        return committed


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """(id, fields) pairs of an XREADGROUP reply; a deleted entry comes with no fields."""
    return [
        (entry_id, dict(fields or {})) for _, batch in reply or [] for entry_id, fields in batch
    ]


def _is_async(handler: Handler) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with `async def __call__`
    )


async def _in_daemon_thread(func: Callable[[Entry], Any], entry: Entry) -> Any:
    """Run a sync handler in a daemon thread. Unlike the default executor, an abandoned
    handler does not hold up the process's exit after SIGTERM's grace period."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def target() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(func, entry)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # SystemExit and friends fail the entry, not the agent
            error = RuntimeError(f"handler raised {type(exc).__name__}: {exc}")
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=target, name=f"rig-handler-{entry.id}", daemon=True).start()
    return await future


async def run_agent(
    handler: Handler,
    *,
    agent_id: str,
    group: str,
    settings: AgentSettings | None = None,
    stream: str | None = None,
    start_id: str = "0",
    consumer: str | None = None,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
    block_ms: int = BLOCK_MS,
) -> None:
    """Run an agent until `stop` is set (or SIGTERM/SIGINT with `handle_signals`).

    Raises ConsumerInUse when another live process holds the consumer name, LeaseLost when one
    takes it over, RedisError when Redis is unreachable at start.
    """
    settings = settings or load_agent_settings()
    name = consumer or consumer_name(agent_id)
    redis = redis_streams.connect(settings.redis_url)
    conductor = ConductorClient(
        base_url=settings.conductor_url, agent_id=agent_id, consumer=name, token=settings.token
    )
    agent = Agent(
        handler,
        settings=settings,
        agent_id=agent_id,
        group=group,
        stream=stream or settings.dispatch_stream,
        consumer=name,
        redis=redis,
        conductor=conductor,
        start_id=start_id,
        stop=stop,
        shutdown_grace_s=shutdown_grace_s,
        block_ms=block_ms,
    )
    try:
        with _signals(agent) if handle_signals else contextlib.nullcontext():
            await agent.run()
    finally:
        await conductor.aclose()
        await redis.aclose()


@contextlib.contextmanager
def _signals(agent: Agent) -> Iterator[None]:
    loop = asyncio.get_running_loop()

    def received(sig: signal.Signals) -> None:
        if agent.stop.is_set():
            logger.warning("%s again: abandoning the current entry", sig.name)
            agent.abandon()
            return
        logger.info("%s received: stopping after the current entry", sig.name)
        agent.stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, received, sig)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


__all__ = [
    "Agent",
    "AgentError",
    "ConsumerInUse",
    "Entry",
    "Handler",
    "LeaseLost",
    "consumer_name",
    "run_agent",
]
