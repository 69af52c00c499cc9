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

import re

from kubernetes import client as k8s_client

from rig_conductor.reaper.election import (
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_LEASE_NAME,
    Elector,
    OnChange,
    replica_identity,
)
from rig_conductor.reaper.lease_k8s import LeaseAction, LeaseElector, lease_action
from rig_conductor.reaper.lease_row import LeaseRowElector
from rig_conductor.settings import SERVICE_ACCOUNT_NAMESPACE, Settings

__all__ = [
    "DEFAULT_LEASE_DURATION_S",
    "DEFAULT_LEASE_NAME",
    "Elector",
    "LeaseAction",
    "LeaseElector",
    "LeaseRowElector",
    "OnChange",
    "lease_action",
    "lease_name",
    "make_elector",
    "replica_identity",
]


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
