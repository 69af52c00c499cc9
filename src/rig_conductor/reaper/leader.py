"""One active reaper among replicas: leader election behind one small interface.

Two backends, same `Elector` interface (`start()`, `stop()`, `is_leader`, `on_change`) and the
same timing: a leader renews every ~1/3 of the lease duration and considers itself leader only
until 2/3 of the duration after its last successful renewal began, so it stops acting before
any follower may take over (the remaining 1/3 absorbs a slow answer or a clock running at a
different rate); a stopping leader hands the lease back at once; a dead one is replaced once its
lease has run out, within the duration and one renew period.
- `LeaseElector`, in a cluster: a coordination.k8s.io/v1 Lease, as client-go does it. Read the
  Lease; create it when absent (404); renew it when we hold it; take it over when it has no
  holder or its renewTime + leaseDurationSeconds has passed; every write carries the
  resourceVersion that was read, so a 409 Conflict means somebody else wrote first and we are
  not the leader.
- `LeaseRowElector`, elsewhere: a row per tenant in PostgreSQL (`reaper_lease`), taken or
  renewed by one autocommit statement per attempt that compares expiry times on PostgreSQL's
  own clock (`adapters.postgres.leases`). Nothing lives in the database session, so it works
  through PgBouncer in transaction pooling mode, where a session advisory lock would not: the
  pooler runs each transaction on any server connection, and a session lock would be left on
  whichever one took it.

Leadership only decides who runs the scheduled scan; it is not what keeps reclaims safe. That is
the XCLAIM min-idle guard, which stays correct even if two replicas briefly both lead.
This module must not scan or reclaim anything itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import psycopg
from kubernetes import client as k8s_client

from rig_conductor.adapters import kubernetes
from rig_conductor.adapters.postgres import leases, queries
from rig_conductor.settings import SERVICE_ACCOUNT_NAMESPACE, Settings

logger = logging.getLogger(__name__)

OnChange = Callable[[bool], Awaitable[None] | None]
Clock = Callable[[], datetime]

DEFAULT_LEASE_NAME = "rig-conductor-reaper"
DEFAULT_LEASE_DURATION_S = 15


class Elector(Protocol):
    """Who leads: `is_leader` is true on at most one replica at a time (given sane clocks)."""

    @property
    def identity(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def trouble(self) -> str | None:
        """Why the election cannot be decided (its backend has failed every attempt for as long
        as a leader may go without renewing), else None."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def replica_identity(environ: Mapping[str, str] | None = None) -> str:
    """`<pod name>_<pid>_<random>`: HOSTNAME is the pod name in a cluster, else the host name.

    Unique to this process start: whoever holds the lease is told apart by this name alone, and
    two containers can share a host name (host networking) and a pid (both 1).
    """
    environ = os.environ if environ is None else environ
    host = environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{os.getpid()}_{secrets.token_hex(3)}"


def lease_name(tenant: str) -> str:
    """`rig-conductor-reaper` for the default tenant, `rig-conductor-reaper-<tenant>` otherwise."""
    if tenant == "default":
        return DEFAULT_LEASE_NAME
    slug = re.sub(r"[^a-z0-9-]+", "-", tenant.lower()).strip("-")
    return f"{DEFAULT_LEASE_NAME}-{slug}"[:63].rstrip("-")


def make_elector(
    *,
    settings: Settings,
    api: k8s_client.ApiClient | None,
    identity: str | None = None,
    on_change: OnChange | None = None,
) -> Elector:
    """A Lease elector when `api` is given (Kubernetes is on), else a lease row in PostgreSQL.

    The Lease lives in the conductor's own namespace (its service account's), else in
    RIG_K8S_NAMESPACE / `default`.
    """
    identity = identity or replica_identity()
    if api is not None:
        return LeaseElector(
            api=api,
            namespace=_own_namespace(settings),
            name=lease_name(settings.tenant),
            identity=identity,
            on_change=on_change,
        )
    return LeaseRowElector(
        database_url=settings.sqlalchemy_url,
        tenant=settings.tenant,
        identity=identity,
        on_change=on_change,
    )


def _own_namespace(settings: Settings) -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or settings.namespace()
    except OSError:
        return settings.namespace()


class _Elector:
    """What both backends share: the loop, the timing, the flag and the change callback."""

    def __init__(
        self, *, identity: str, on_change: OnChange | None, kind: str, duration_s: float
    ) -> None:
        self._identity = identity
        self._on_change = on_change
        self._kind = kind
        self._leader = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._callbacks: set[asyncio.Future[None]] = set()
        self._expiry: asyncio.TimerHandle | None = None
        self._trouble: str | None = None
        self._failing_since: float | None = None  # monotonic time of the first failed attempt
        self.duration_s = duration_s
        self.period_s = duration_s / 3
        self.deadline_s = duration_s * 2 / 3
        self.retry_s = self.period_s / 2.5  # after a failed attempt: 2 s for a 15 s lease

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def trouble(self) -> str | None:
        since = self._failing_since
        if since is None or time.monotonic() < since + self.deadline_s:
            return None  # one failed attempt is no outage: a leader would still be leading
        return self._trouble

    def _failed(self, why: str) -> bool:
        """An attempt failed for want of the backend; True when it is the first in a row."""
        first = self._failing_since is None
        if first:
            self._failing_since = time.monotonic()
        self._trouble = why
        return first

    def _answered(self) -> bool:
        """The backend answered; True when it had failed before."""
        recovered = self._failing_since is not None
        self._failing_since = None
        self._trouble = None
        return recovered

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("elector already started")
        self._task = asyncio.create_task(self._run(), name=f"{self._kind}-elector")
        logger.info("Leader election (%s) started as %s", self._kind, self._identity)

    async def _run(self) -> None:
        raise NotImplementedError

    async def _stop_task(self) -> None:
        """End the loop now. An attempt in flight in a worker thread may still land; that is
        safe: its write and a release race on one resourceVersion, and the loser gets a 409."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)

    def _set_leader(self, value: bool, why: str) -> None:
        if value == self._leader:
            return
        self._leader = value
        if value:
            logger.info("%s is now the leader (%s): %s", self._identity, self._kind, why)
        else:
            logger.warning("%s is no longer the leader (%s): %s", self._identity, self._kind, why)
        if self._on_change is None:
            return
        try:
            result = self._on_change(value)
        except Exception:
            logger.exception("Leadership change callback failed")
            return
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            self._callbacks.add(future)
            future.add_done_callback(self._callback_done)

    def _callback_done(self, future: asyncio.Future[None]) -> None:
        self._callbacks.discard(future)
        if not future.cancelled() and future.exception() is not None:
            logger.error("Leadership change callback failed: %r", future.exception())

    def _renewed(self, loop: asyncio.AbstractEventLoop, *, valid_until: float, why: str) -> None:
        """Leader until `valid_until` (loop time) unless renewed again before."""
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = loop.call_at(valid_until, self._lose, "renew deadline passed")
        self._set_leader(True, why)

    def _lose(self, why: str) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._set_leader(False, why)


class LeaseAction(enum.Enum):
    CREATE = "create"
    RENEW = "renew"
    TAKE_OVER = "take-over"
    FOLLOW = "follow"


def lease_action(
    record: kubernetes.LeaseRecord | None, *, identity: str, now: datetime
) -> LeaseAction:
    """What a candidate does with the Lease it just read. Pure."""
    if record is None:
        return LeaseAction.CREATE
    if record.holder == identity:
        return LeaseAction.RENEW
    if not record.holder or record.renew_time is None or not record.duration_s:
        return LeaseAction.TAKE_OVER
    if record.renew_time + timedelta(seconds=record.duration_s) <= now:
        return LeaseAction.TAKE_OVER
    return LeaseAction.FOLLOW


class LeaseElector(_Elector):
    """Leader election on a coordination.k8s.io/v1 Lease (see the module docstring)."""

    def __init__(
        self,
        *,
        api: k8s_client.ApiClient,
        namespace: str,
        name: str = DEFAULT_LEASE_NAME,
        identity: str | None = None,
        lease_duration_s: int = DEFAULT_LEASE_DURATION_S,
        on_change: OnChange | None = None,
        clock: Clock | None = None,
    ) -> None:
        if lease_duration_s < 1:
            raise ValueError("lease_duration_s must be at least 1")
        super().__init__(
            identity=identity or replica_identity(),
            on_change=on_change,
            kind="lease",
            duration_s=lease_duration_s,
        )
        self.api = api
        self.namespace = namespace
        self.name = name
        self._seconds = lease_duration_s  # leaseDurationSeconds is an integer
        # (connect, read) per request: an attempt (a read and a write) fits in ~1 period.
        self._timeout = (min(self.period_s / 2, 2.0), min(self.period_s / 2, 5.0))
        self._clock = clock or (lambda: datetime.now(UTC))
        self.holder: str | None = None  # the holder seen at the last read

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing; when leading, hand the Lease back so a follower need not wait it out.

        `release=False` leaves the Lease to expire, as a crashed replica would.
        """
        await self._stop_task()
        was_leader = self._leader
        self._lose("stopped")
        if release and was_leader:
            try:
                await asyncio.wait_for(
                    asyncio.to_thread(self._release), timeout=2 * sum(self._timeout)
                )
            except (kubernetes.KubernetesUnavailable, kubernetes.Conflict, TimeoutError) as exc:
                logger.info(
                    "Lease %s/%s not released, it will expire instead: %r",
                    self.namespace,
                    self.name,
                    exc,
                )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            began = loop.time()
            pause = self.period_s
            try:
                held = await asyncio.to_thread(self._attempt)
            except kubernetes.Conflict as exc:
                self._answered()
                self._lose(f"conflict on Lease {self.namespace}/{self.name}: {exc}")
            except kubernetes.KubernetesUnavailable as exc:
                # Leadership, if any, lasts until the renew deadline timer says otherwise;
                # retry sooner so one failed renewal does not cost it.
                logger.warning("Lease %s/%s unavailable: %s", self.namespace, self.name, exc)
                self._failed(f"Lease {self.namespace}/{self.name} unavailable: {exc}")
                pause = self.retry_s
            else:
                self._answered()
                if not held:
                    self._lose(f"Lease {self.namespace}/{self.name} is held by {self.holder}")
                elif loop.time() < began + self.deadline_s and not self._stopping.is_set():
                    self._renewed(
                        loop,
                        valid_until=began + self.deadline_s,
                        why=f"holds Lease {self.namespace}/{self.name}",
                    )
            await self._pause(pause)

    def _attempt(self) -> bool:
        """One read and at most one write (in a worker thread). True when we hold the Lease."""
        now = self._clock()
        record = kubernetes.read_lease(
            self.api, namespace=self.namespace, name=self.name, timeout=self._timeout
        )
        self.holder = record.holder if record else None
        action = lease_action(record, identity=self.identity, now=now)
        if action is LeaseAction.FOLLOW:
            return False
        if record is None:
            kubernetes.create_lease(
                self.api,
                namespace=self.namespace,
                name=self.name,
                holder=self.identity,
                duration_s=self._seconds,
                now=now,
                timeout=self._timeout,
            )
        else:
            renewing = action is LeaseAction.RENEW
            kubernetes.replace_lease(
                self.api,
                namespace=self.namespace,
                name=self.name,
                resource_version=record.resource_version,
                holder=self.identity,
                duration_s=self._seconds,
                acquire_time=(record.acquire_time or now) if renewing else now,
                renew_time=now,
                transitions=record.transitions if renewing else record.transitions + 1,
                timeout=self._timeout,
            )
        self.holder = self.identity
        return True

    def _release(self) -> None:
        """Clear the holder, as client-go's ReleaseOnCancel does, if we still hold it."""
        record = kubernetes.read_lease(
            self.api, namespace=self.namespace, name=self.name, timeout=self._timeout
        )
        if record is None or record.holder != self.identity:
            return
        now = self._clock()
        kubernetes.replace_lease(
            self.api,
            namespace=self.namespace,
            name=self.name,
            resource_version=record.resource_version,
            holder=None,
            duration_s=1,
            acquire_time=now,
            renew_time=now,
            transitions=record.transitions,
            timeout=self._timeout,
        )
        logger.info("Released Lease %s/%s", self.namespace, self.name)


class LeaseRowElector(_Elector):
    """Leader election on a lease row in PostgreSQL (see the module docstring).

    The attempts run on a connection of the elector's own, outside the engine's pool, so a pool
    busy with API calls cannot make the leader miss its renewals. The connection carries no
    state: a broken one is simply opened again, on any server connection the pooler picks.
    """

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

    async def stop(self, *, release: bool = True) -> None:
        """Stop renewing; when leading, hand the lease back so a follower need not wait it out.

        `release=False` leaves the lease to expire, as a crashed replica would.
        """
        await self._stop_task()
        was_leader = self._leader
        self._lose("stopped")
        if release and was_leader:
            try:
                await asyncio.wait_for(self._release(), timeout=2 * self._timeout_s)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                logger.info(
                    "Reaper lease of tenant %s not released, it will expire instead: %s",
                    self.tenant,
                    _one_line(exc),
                )
        await self._disconnect()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            began = loop.time()
            pause = self.period_s
            try:
                # The connect is bounded by its own connect_timeout: cancelling psycopg's connect
                # half-way would leave an open connection behind, unreferenced.
                conn = await self._connection()
                claim = await asyncio.wait_for(self._attempt(conn), timeout=self._timeout_s)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                # Leadership, if any, lasts until the renew deadline timer says otherwise;
                # retry sooner so one failed renewal does not cost it.
                await self._disconnect()
                if self._failed(f"PostgreSQL unavailable: {_one_line(exc)}"):
                    logger.warning(
                        "Reaper lease of tenant %s unavailable: %s", self.tenant, _one_line(exc)
                    )
                pause = self.retry_s
            else:
                if self._answered():
                    logger.info("Reaper lease of tenant %s reachable again", self.tenant)
                self.holder = claim.holder
                if not claim.held:
                    self._lose(f"reaper lease of tenant {self.tenant} is held by {claim.holder}")
                elif loop.time() < began + self.deadline_s and not self._stopping.is_set():
                    self._renewed(
                        loop,
                        valid_until=began + self.deadline_s,
                        why=f"holds the reaper lease of tenant {self.tenant}",
                    )
            await self._pause(pause)

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        conn = self._conn
        if conn is None or conn.closed:
            connecting = asyncio.ensure_future(
                queries.connect_direct(
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
