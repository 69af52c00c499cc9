"""Heartbeat intake with group commit: concurrent heartbeats share one transaction.

Each request waits until the batch holding its heartbeat has committed, so a 202 always means
durable. While a batch is being written, newly arriving heartbeats queue for the next one:
batches grow with load and add no delay when idle.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters.postgres import queries

logger = logging.getLogger(__name__)

MAX_BATCH = 1_000


class HeartbeatWriter:
    def __init__(self, engine: AsyncEngine, *, tenant: str) -> None:
        self._engine = engine
        self._tenant = tenant
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
                return

    async def _write(
        self, batch: list[tuple[queries.HeartbeatIn, asyncio.Future[datetime]]]
    ) -> None:
        try:
            received_at = await queries.record_heartbeats(
                self._engine, tenant=self._tenant, heartbeats=[hb for hb, _ in batch]
            )
        except Exception as exc:  # every waiter gets the failure; the writer carries on
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for _, future in batch:
            if not future.done():
                future.set_result(received_at)
