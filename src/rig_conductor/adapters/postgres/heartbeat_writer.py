"""Heartbeat intake with group commit: concurrent heartbeats share one transaction.

Each request waits until the batch holding its heartbeat has committed, so a 202 always means
durable. While a batch is being written, newly arriving heartbeats queue for the next one:
batches grow with load (and with the database's latency) and add no delay when idle. The writer
keeps a connection of its own (no pool checkout, autocommit), so a batch is a single round trip.
A connection that broke while idle (PostgreSQL restarted, a pooler or a firewall closed it) is
only found out by the next batch: that batch is written again at once on a new connection. When
that fails too (PostgreSQL is down) the batch's requests fail (503), and the next batch connects
anew.

One writer per process: a second connection writing batches in parallel halves the batch size,
and every transaction has a fixed cost in the client and in PostgreSQL that a larger batch
shares out.

The writer also marks, four times per `slack_ms`, that this replica is listening
(`listening.mark`), unless a batch failed since the last mark: time in which no replica could
store heartbeats is a blind spell, which rule 3 (docs/rules.md) does not count as silence.
The mark that ends a spell is logged, and handed to `on_spell_end`. The marks stop at
`stop_marking`, once the server in front has stopped taking connections: its graceful shutdown
may take seconds to finish the requests in flight, and heartbeats sent meanwhile are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from rig_conductor.adapters.postgres import intake, listening
from rig_conductor.domain import Span

logger = logging.getLogger(__name__)

MAX_BATCH = 1_000

# Called with each batch once it is committed, before its requests are answered.
OnCommit = Callable[[Sequence[intake.HeartbeatIn]], None]
# Called with each blind spell this replica's listening mark ended.
OnSpellEnd = Callable[[Span], None]


class HeartbeatWriter:
    def __init__(
        self,
        database_url: str,
        *,
        tenant: str,
        replica: str = "",
        slack_ms: int = 5_000,
        break_ms: int = intake.DEFAULT_BREAK_MS,
        on_commit: OnCommit | None = None,
        on_spell_end: OnSpellEnd | None = None,
    ) -> None:
        self._url = database_url
        self._tenant = tenant
        self._replica = replica
        self._slack_ms = slack_ms
        self._break_ms = break_ms
        self._on_commit = on_commit
        self._on_spell_end = on_spell_end
        self._mark_due = True
        self._failed = False  # a batch failed since the last mark
        self._row_id: int | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._queue: list[tuple[intake.HeartbeatIn, asyncio.Future[datetime]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._marking = True

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat-writer")
        self._ticker = asyncio.create_task(self._tick(), name="listening-marks")

    async def submit(self, heartbeat: intake.HeartbeatIn) -> datetime:
        """Queue one heartbeat; returns the receipt time once it is committed."""
        if self._closing or self._task is None:
            raise RuntimeError("the heartbeat writer is not running")
        future: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()
        self._queue.append((heartbeat, future))
        self._wake.set()
        return await future

    def stop_marking(self) -> None:
        """Mark this replica as listening no more: its server takes no new connections. The
        heartbeats of requests already in flight are still written."""
        self._marking = False

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._task is not None:
            await self._task

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._slack_ms / 4000)
            self._mark_due = True
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue or self._marks_due():
                if self._queue:
                    batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                    await self._write(batch)
                if self._marks_due():  # between batches, even under load
                    self._mark_due = False
                    await self._mark()
            if self._closing:
                if self._conn is not None:
                    await self._conn.close()
                return

    def _marks_due(self) -> bool:
        return self._mark_due and self._marking and not self._closing

    async def _write(
        self, batch: list[tuple[intake.HeartbeatIn, asyncio.Future[datetime]]]
    ) -> None:
        heartbeats = [hb for hb, _ in batch]
        try:
            try:
                reused = self._conn is not None and not self._conn.closed
                received_at = await self._record(heartbeats)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                if not reused:
                    raise
                # A stale connection. Writing the batch twice is harmless should the first
                # write have committed after all: the rows keep the latest state, and the
                # open liveness interval counts those beats twice.
                await self._drop_connection()
                received_at = await self._record(heartbeats)
        except Exception as exc:  # every waiter gets the failure; the writer carries on
            self._failed = True
            await self._drop_connection()
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if self._on_commit is not None:
            try:
                self._on_commit(heartbeats)
            except Exception:  # bookkeeping only: the batch is committed all the same
                logger.exception("Heartbeat commit hook failed")
        for _, future in batch:
            if not future.done():
                future.set_result(received_at)

    async def _mark(self) -> None:
        """Mark this replica as listening, unless its heartbeat writes failed since the last."""
        if self._failed:
            self._failed = False
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await intake.connect_direct(self._url)
            mark = await listening.mark(
                self._conn,
                tenant=self._tenant,
                replica=self._replica,
                row_id=self._row_id,
                slack_ms=self._slack_ms,
            )
        except Exception as exc:  # PostgreSQL unreachable: no mark, which is the point
            logger.debug("Listening mark failed: %r", exc)
            await self._drop_connection()
            return
        self._row_id = mark.row_id
        spell = mark.ended_spell
        if spell is None:
            return
        seconds = (spell.end - spell.start).total_seconds()
        logger.warning(
            "Blind spell over: no conductor could take heartbeats in for %.1f s (%s to %s); "
            "that time does not count toward RIG_AGENT_DOWN_MS",
            seconds,
            spell.start.isoformat(timespec="seconds"),
            spell.end.isoformat(timespec="seconds"),
            extra={"blindSeconds": round(seconds, 3)},
        )
        if self._on_spell_end is not None:
            self._on_spell_end(spell)

    async def _record(self, heartbeats: list[intake.HeartbeatIn]) -> datetime:
        if self._conn is None or self._conn.closed:
            self._conn = await intake.connect_direct(self._url)
        return await intake.record_heartbeats_on(
            self._conn, tenant=self._tenant, heartbeats=heartbeats, break_ms=self._break_ms
        )

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
