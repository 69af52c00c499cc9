"""One active reaper among replicas: leader election behind one small interface.

Two backends, same `Elector` interface (`start()`, `stop()`, `is_leader`, `on_change`):
- `LeaseElector`, in a cluster: a coordination.k8s.io/v1 Lease, as client-go does it. Read the
  Lease; create it when absent (404); renew it when we hold it; take it over when it has no
  holder or its renewTime + leaseDurationSeconds has passed; every write carries the
  resourceVersion that was read, so a 409 Conflict means somebody else wrote first and we are
  not the leader. The leader renews every ~1/3 of the duration and considers itself leader only
  until 2/3 of the duration after its last successful renewal began, so it stops acting before
  any follower may take over (the remaining 1/3 absorbs clock skew between replicas).
- `AdvisoryLockElector`, elsewhere: `pg_try_advisory_lock` on a dedicated PostgreSQL
  connection kept open while leading. The lock lives and dies with that session: a lost
  connection is lost leadership, and a dead leader's lock is released by the server as soon as
  its connection closes.

Leadership only decides who runs the scheduled scan; it is not what keeps reclaims safe. That is
the XCLAIM min-idle guard, which stays correct even if two replicas briefly both lead.
This module must not scan or reclaim anything itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import inspect
import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Protocol

import psycopg
from kubernetes import client as k8s_client
from psycopg.rows import TupleRow
from sqlalchemy.engine import make_url

from rig_conductor.adapters import kubernetes
from rig_conductor.settings import SERVICE_ACCOUNT_NAMESPACE, Settings

logger = logging.getLogger(__name__)

OnChange = Callable[[bool], Awaitable[None] | None]
Clock = Callable[[], datetime]

DEFAULT_LEASE_NAME = "rig-conductor-reaper"
DEFAULT_LEASE_DURATION_S = 15
DEFAULT_LOCK_PERIOD_S = 5.0


class Elector(Protocol):
    """Who leads: `is_leader` is true on at most one replica at a time (given sane clocks)."""

    @property
    def identity(self) -> str: ...

    @property
    def is_leader(self) -> bool: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def replica_identity(environ: Mapping[str, str] | None = None) -> str:
    """`<pod name>_<pid>`: HOSTNAME is the pod name in a cluster, else the host name."""
    environ = os.environ if environ is None else environ
    host = environ.get("HOSTNAME") or socket.gethostname()
    return f"{host}_{os.getpid()}"


def lease_name(tenant: str) -> str:
    """`rig-conductor-reaper` for the default tenant, `rig-conductor-reaper-<tenant>` otherwise."""
    if tenant == "default":
        return DEFAULT_LEASE_NAME
    slug = re.sub(r"[^a-z0-9-]+", "-", tenant.lower()).strip("-")
    return f"{DEFAULT_LEASE_NAME}-{slug}"[:63].rstrip("-")


def advisory_key(tenant: str) -> int:
    """A stable signed 64-bit key for pg_try_advisory_lock, one per tenant."""
    digest = hashlib.sha256(f"rig-conductor:reaper:{tenant}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def make_elector(
    *,
    settings: Settings,
    api: k8s_client.ApiClient | None,
    identity: str | None = None,
    on_change: OnChange | None = None,
) -> Elector:
    """A Lease elector when `api` is given (Kubernetes is on), else a PostgreSQL advisory lock.

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
    return AdvisoryLockElector(
        database_url=settings.sqlalchemy_url,
        key=advisory_key(settings.tenant),
        identity=identity,
        on_change=on_change,
    )


def _own_namespace(settings: Settings) -> str:
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or settings.namespace()
    except OSError:
        return settings.namespace()


class _Elector:
    """The loop, the flag and the change callback both backends share."""

    def __init__(self, *, identity: str, on_change: OnChange | None, kind: str) -> None:
        self._identity = identity
        self._on_change = on_change
        self._kind = kind
        self._leader = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._callbacks: set[asyncio.Future[None]] = set()

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def is_leader(self) -> bool:
        return self._leader

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
        super().__init__(identity=identity or replica_identity(), on_change=on_change, kind="lease")
        if lease_duration_s < 1:
            raise ValueError("lease_duration_s must be at least 1")
        self.api = api
        self.namespace = namespace
        self.name = name
        self.duration_s = lease_duration_s
        self.period_s = lease_duration_s / 3
        self.deadline_s = lease_duration_s * 2 / 3
        self.retry_s = self.period_s / 2.5  # after a failed attempt: 2 s for a 15 s lease
        # (connect, read) per request: an attempt (a read and a write) fits in ~1 period.
        self._timeout = (min(self.period_s / 2, 2.0), min(self.period_s / 2, 5.0))
        self._clock = clock or (lambda: datetime.now(UTC))
        self._expiry: asyncio.TimerHandle | None = None
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
                self._lose(f"conflict on Lease {self.namespace}/{self.name}: {exc}")
            except kubernetes.KubernetesUnavailable as exc:
                # Leadership, if any, lasts until the renew deadline timer says otherwise;
                # retry sooner so one failed renewal does not cost it.
                logger.warning("Lease %s/%s unavailable: %s", self.namespace, self.name, exc)
                pause = self.retry_s
            else:
                if not held:
                    self._lose(f"Lease {self.namespace}/{self.name} is held by {self.holder}")
                elif loop.time() < began + self.deadline_s and not self._stopping.is_set():
                    self._renewed(loop, valid_until=began + self.deadline_s)
            await self._pause(pause)

    def _renewed(self, loop: asyncio.AbstractEventLoop, *, valid_until: float) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry = loop.call_at(valid_until, self._lose, "renew deadline passed")
        self._set_leader(True, f"holds Lease {self.namespace}/{self.name}")

    def _lose(self, why: str) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._set_leader(False, why)

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
                duration_s=self.duration_s,
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
                duration_s=self.duration_s,
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


class AdvisoryLockElector(_Elector):
    """Leader election on a PostgreSQL session-level advisory lock (see the module docstring).

    While leading, the loop waits on the connection's socket between checks, so a connection the
    server closes (restart, pg_terminate_backend) ends leadership at once, not at the next check.
    TCP keepalives bound how long a silently dead network path goes unnoticed.
    """

    def __init__(
        self,
        *,
        database_url: str,
        key: int,
        identity: str | None = None,
        period_s: float = DEFAULT_LOCK_PERIOD_S,
        on_change: OnChange | None = None,
    ) -> None:
        super().__init__(
            identity=identity or replica_identity(), on_change=on_change, kind="advisory-lock"
        )
        url = make_url(database_url).set(drivername="postgresql")
        self._conninfo = url.render_as_string(hide_password=False)
        self.key = key
        self.period_s = period_s
        self._timeout_s = max(1.0, min(period_s, 10.0))
        self._conn: psycopg.AsyncConnection[TupleRow] | None = None

    @property
    def backend_pid(self) -> int | None:
        """The server process holding (or trying for) the lock, for operators and tests."""
        conn = self._conn
        return conn.info.backend_pid if conn is not None and not conn.closed else None

    async def stop(self, *, release: bool = True) -> None:
        """Stop; closing the session releases the lock (unlocked explicitly first if asked)."""
        await self._stop_task()
        was_leader = self._leader
        self._set_leader(False, "stopped")
        if release and was_leader and self._conn is not None:
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                await asyncio.wait_for(
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,)),
                    timeout=self._timeout_s,
                )
        await self._disconnect()

    async def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                held = await asyncio.wait_for(self._attempt(), timeout=self._timeout_s)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                await self._disconnect()
                self._set_leader(False, f"PostgreSQL connection lost: {_one_line(exc)}")
                await self._pause(self.period_s)
                continue
            self._set_leader(held, f"advisory lock {self.key}")
            if held:
                await self._hold(self.period_s)
            else:
                await self._pause(self.period_s)

    async def _attempt(self) -> bool:
        conn = self._conn
        if conn is None or conn.closed:
            conn = self._conn = await psycopg.AsyncConnection.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=max(1, int(self._timeout_s)),
                application_name=f"rig-conductor leader {self.identity}"[:63],
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )
        if self._leader:
            await conn.execute("SELECT 1")
            return True
        cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
        row = await cursor.fetchone()
        return bool(row and row[0])

    async def _hold(self, seconds: float) -> None:
        """Wait `seconds` on the leader's connection; a broken connection ends leadership now."""
        conn = self._conn
        assert conn is not None
        try:
            async for _ in conn.notifies(timeout=seconds):
                pass
        except (psycopg.Error, OSError) as exc:
            await self._disconnect()
            self._set_leader(False, f"PostgreSQL connection lost: {_one_line(exc)}")

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
                await asyncio.wait_for(conn.close(), timeout=self._timeout_s)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
