"""The reaper's elector in a cluster: a coordination.k8s.io/v1 Lease, as client-go does it (see
`reaper.leader`)."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s_client

from rig_conductor import logs
from rig_conductor.adapters import kubernetes
from rig_conductor.reaper.election import (
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_LEASE_NAME,
    BackendUnreachable,
    ElectorBase,
    OnChange,
    replica_identity,
)

logger = logging.getLogger(logs.LEADER_LOGGER)

Clock = Callable[[], datetime]


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


class LeaseElector(ElectorBase):
    """Leader election on a coordination.k8s.io/v1 Lease (see the module docstring)."""

    _release_errors = (kubernetes.KubernetesUnavailable, kubernetes.Conflict)

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

    def _lease(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def _release(self) -> None:
        await asyncio.to_thread(self._clear_holder)

    def _release_timeout_s(self) -> float:
        return 2 * sum(self._timeout)

    async def _claim(self) -> str | None:
        try:
            leading = await asyncio.to_thread(self._attempt)
        except kubernetes.Conflict as exc:
            self._answered()
            return f"conflict on Lease {self.namespace}/{self.name}: {exc}"
        except kubernetes.KubernetesUnavailable as exc:
            logger.warning("Lease %s/%s unavailable: %s", self.namespace, self.name, exc)
            self._failed(f"Lease {self.namespace}/{self.name} unavailable: {exc}")
            raise BackendUnreachable from exc
        self._answered()
        return None if leading else f"Lease {self.namespace}/{self.name} is held by {self.holder}"

    def _holding(self) -> str:
        return f"holds Lease {self.namespace}/{self.name}"

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

    def _clear_holder(self) -> None:
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
