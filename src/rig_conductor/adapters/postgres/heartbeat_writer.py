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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import psycopg

from rig_conductor.adapters.postgres import queries

logger = logging.getLogger(__name__)

MAX_BATCH = 1_000

# Called with each batch once it is committed, before its requests are answered.
OnCommit = Callable[[Sequence[queries.HeartbeatIn]], None]


class HeartbeatWriter:
    def __init__(
        self, database_url: str, *, tenant: str, on_commit: OnCommit | None = None
    ) -> None:
        self._url = database_url
        self._tenant = tenant
        self._on_commit = on_commit
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._queue: list[tuple[queries.HeartbeatIn, asyncio.Future[datetime]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heartbeat-writer")

    async def submit(self, heartbeat: queries.HeartbeatIn) -> datetime:
        """Queue one heartbeat; returns the receipt time once it is committed."""
        if self._closing or self._task is None:
            raise RuntimeError("the heartbeat writer is not running")
        future: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()
        self._queue.append((heartbeat, future))
        self._wake.set()
        return await future

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                await self._write(batch)
            if self._closing:
                if self._conn is not None:
                    await self._conn.close()
                return

    async def _write(
        self, batch: list[tuple[queries.HeartbeatIn, asyncio.Future[datetime]]]
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
                # event log gains a duplicate heartbeat.
                await self._drop_connection()
                received_at = await self._record(heartbeats)
        except Exception as exc:  # every waiter gets the failure; the writer carries on
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

    async def _record(self, heartbeats: list[queries.HeartbeatIn]) -> datetime:
        if self._conn is None or self._conn.closed:
            self._conn = await queries.connect_direct(self._url)
        return await queries.record_heartbeats_on(
            self._conn, tenant=self._tenant, heartbeats=heartbeats
        )

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
