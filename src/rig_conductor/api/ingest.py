"""Heartbeat intake with group commit: concurrent heartbeats share one transaction.

Each request waits until the batch holding its heartbeat has committed, so a 202 always means
durable. While a batch is being written, newly arriving heartbeats queue for the next one:
batches grow with load and add no delay when idle. Each lane of the writer keeps a connection
of its own (no pool checkout, autocommit), so a batch is a single round trip; a broken
connection fails that batch's requests (503) and the next batch reconnects.

Lanes let batches overlap while PostgreSQL works on one. Heartbeats are routed to a lane by
agent id, so two batches in flight never touch the same rows and cannot deadlock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import datetime
from typing import Any

import psycopg

from rig_conductor.adapters.postgres import queries

logger = logging.getLogger(__name__)

MAX_BATCH = 1_000
LANES = 2


class HeartbeatWriter:
    def __init__(self, database_url: str, *, tenant: str, lanes: int = LANES) -> None:
        self._lanes = [
            _Lane(database_url, tenant=tenant, name=f"heartbeats-{n}") for n in range(lanes)
        ]

    def start(self) -> None:
        for lane in self._lanes:
            lane.start()

    async def submit(self, heartbeat: queries.HeartbeatIn) -> datetime:
        """Queue one heartbeat; returns the receipt time once it is committed."""
        lane = self._lanes[hash(heartbeat.agent_id) % len(self._lanes)]
        return await lane.submit(heartbeat)

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        await asyncio.gather(*(lane.stop() for lane in self._lanes))


class _Lane:
    """One connection's group commit."""

    def __init__(self, database_url: str, *, tenant: str, name: str) -> None:
        self._name = name
        self._url = database_url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._tenant = tenant
        self._queue: list[tuple[queries.HeartbeatIn, asyncio.Future[datetime]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self._name)

    async def submit(self, heartbeat: queries.HeartbeatIn) -> datetime:
        if self._closing or self._task is None:
            raise RuntimeError("the heartbeat writer is not running")
        future: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()
        self._queue.append((heartbeat, future))
        self._wake.set()
        return await future

    async def stop(self) -> None:
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
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await queries.connect_direct(self._url)
            received_at = await queries.record_heartbeats_on(
                self._conn, tenant=self._tenant, heartbeats=[hb for hb, _ in batch]
            )
        except Exception as exc:  # every waiter gets the failure; the writer carries on
            await self._drop_connection()
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(received_at)

    async def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None
