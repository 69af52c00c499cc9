"""The reaper's elector without Kubernetes: a lease row per tenant in PostgreSQL (see
`reaper.leader`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg

from rig_conductor import logs
from rig_conductor.adapters.postgres import intake, leases
from rig_conductor.reaper.election import (
    DEFAULT_LEASE_DURATION_S,
    BackendUnreachable,
    ElectorBase,
    OnChange,
    one_line,
    replica_identity,
)

logger = logging.getLogger(logs.LEADER_LOGGER)


class LeaseRowElector(ElectorBase):
    """Leader election on a lease row in PostgreSQL (see the module docstring).

    The attempts run on a connection of the elector's own, outside the engine's pool, so a pool
    busy with API calls cannot make the leader miss its renewals. The connection carries no
    state: a broken one is simply opened again, on any server connection the pooler picks.
    """

    _release_errors = (psycopg.Error, OSError)

    def __init__(
        self,
        *,
        database_url: str,
        tenant: str,
        identity: str | None = None,
        lease_duration_s: float = DEFAULT_LEASE_DURATION_S,
        on_change: OnChange | None = None,
    ) -> None:
        if lease_duration_s <= 0:
            raise ValueError("lease_duration_s must be positive")
        super().__init__(
            identity=identity or replica_identity(),
            on_change=on_change,
            kind="lease-row",
            duration_s=lease_duration_s,
        )
        self._url = database_url
        self.tenant = tenant
        # An attempt (at most a connect and one statement) that takes longer is a failed one.
        self._timeout_s = min(self.period_s / 2, 5.0)
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.holder: str | None = None  # the holder seen at the last attempt

    def _lease(self) -> str:
        return f"Reaper lease of tenant {self.tenant}"

    def _release_timeout_s(self) -> float:
        return 2 * self._timeout_s

    async def _closed(self) -> None:
        await self._disconnect()

    async def _claim(self) -> str | None:
        try:
            # The connect is bounded by its own connect_timeout: cancelling psycopg's connect
            # half-way would leave an open connection behind, unreferenced.
            claim = await self._try_take()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            await self._disconnect()
            if self._failed(f"PostgreSQL unavailable: {one_line(exc)}"):
                logger.warning(
                    "Reaper lease of tenant %s unavailable: %s", self.tenant, one_line(exc)
                )
            raise BackendUnreachable from exc
        if self._answered():
            logger.info("Reaper lease of tenant %s reachable again", self.tenant)
        self.holder = claim.holder
        if claim.leading:
            return None
        return f"reaper lease of tenant {self.tenant} is held by {claim.holder}"

    async def _try_take(self) -> leases.LeaseClaim:
        """One attempt, on the kept connection if there is one. If the server had cut that one
        (a failover, an admin, a pooler restart), nothing was kept in it: the attempt is made
        again at once on a new connection rather than a retry period later, which would leave
        a leader only the rest of its renew deadline for the next."""
        kept = self._conn is not None and not self._conn.closed
        conn = await self._connection()
        try:
            return await asyncio.wait_for(self._attempt(conn), timeout=self._timeout_s)
        except psycopg.OperationalError as exc:
            if not (kept and conn.closed):
                raise
            logger.info(
                "Reaper lease of tenant %s: its connection was cut (%s); trying on a new one",
                self.tenant,
                one_line(exc),
            )
        conn = await self._connection()  # a closed connection is replaced
        return await asyncio.wait_for(self._attempt(conn), timeout=self._timeout_s)

    def _holding(self) -> str:
        return f"holds the reaper lease of tenant {self.tenant}"

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            connecting = asyncio.ensure_future(
                intake.connect_direct(
                    self._url,
                    connect_timeout=max(1, int(self._timeout_s)),
                    application_name=f"rig-conductor leader {self.identity}"[:63],
                )
            )
            try:
                conn = self._conn = await asyncio.shield(connecting)
            except asyncio.CancelledError:
                # Stopped or timed out half-way: the connect goes on, and its connection is
                # closed when it arrives rather than left open and unreferenced.
                connecting.add_done_callback(_close_when_connected)
                raise
        return conn

    async def _attempt(self, conn: psycopg.AsyncConnection[Any]) -> leases.LeaseClaim:
        return await leases.try_take(
            conn,
            tenant=self.tenant,
            holder=self.identity,
            duration_s=self.duration_s,
        )

    async def _release(self) -> None:
        conn = self._conn
        if conn is not None and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # An attempt was cut off mid-statement: its connection's state is unknown.
            await self._disconnect()
        if await leases.release(await self._connection(), tenant=self.tenant, holder=self.identity):
            logger.info("Released the reaper lease of tenant %s", self.tenant)

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                await asyncio.wait_for(conn.close(), timeout=self._timeout_s)


_CLOSING: set[asyncio.Future[None]] = set()  # closes in flight, kept until done


def _close_when_connected(connecting: asyncio.Future[psycopg.AsyncConnection[Any]]) -> None:
    if not connecting.cancelled() and connecting.exception() is None:
        closing = asyncio.ensure_future(connecting.result().close())
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)
