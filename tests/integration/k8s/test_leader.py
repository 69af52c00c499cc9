"""Leader election: one Lease on the API stand-in, one lease row on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from kubernetes import client
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters import kubernetes
from rig_conductor.reaper.leader import (
    Elector,
    LeaseAction,
    LeaseElector,
    LeaseRowElector,
    lease_action,
    lease_name,
    make_elector,
    replica_identity,
)
from rig_conductor.settings import Settings

from ..helpers import wait_for
from .standin import Fault, KubeStandIn

DURATION_S = 2  # short leases keep the tests fast; renewals every ~0.67 s
LEASE = "rig-conductor-reaper"


class Changes:
    """What an elector told its replica, and when (wall time, to compare with a lease's)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []
        self.at: list[datetime] = []

    async def __call__(self, leading: bool) -> None:
        self.seen.append(leading)
        self.at.append(datetime.now(UTC))


@pytest.fixture
async def electors() -> AsyncIterator[list[Elector]]:
    """Stops every elector a test started, leaders last."""
    started: list[Elector] = []
    yield started
    for elector in sorted(started, key=lambda e: e.is_leader):
        await elector.stop()


def lease_elector(api: client.ApiClient, identity: str, **kwargs: object) -> LeaseElector:
    return LeaseElector(
        api=api,
        namespace="default",
        name=LEASE,
        identity=identity,
        lease_duration_s=DURATION_S,
        **kwargs,  # type: ignore[arg-type]
    )


async def exactly_one_leader(electors: Sequence[Elector], *, over_s: float) -> Elector:
    """Sample for `over_s`: never two leaders at once, and one at every sample."""
    deadline = time.monotonic() + over_s
    leader: Elector | None = None
    while time.monotonic() < deadline:
        leaders = [e for e in electors if e.is_leader]
        assert len(leaders) == 1, [e.identity for e in leaders]
        leader = leaders[0]
        await asyncio.sleep(0.02)
    assert leader is not None
    return leader


async def never_two_leaders(electors: Sequence[Elector], *, over_s: float) -> None:
    """Sample for `over_s`: never two leaders at once (on a loaded machine a renewal may come
    late, and a moment without a leader is allowed; two never are)."""
    deadline = time.monotonic() + over_s
    while time.monotonic() < deadline:
        leaders = [e.identity for e in electors if e.is_leader]
        assert len(leaders) <= 1, leaders
        await asyncio.sleep(0.02)


# --- the Lease ------------------------------------------------------------------------------


async def test_two_replicas_one_leader_and_a_takeover_after_the_leader_dies(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    a, b = lease_elector(api, "conductor-a_1"), lease_elector(api, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()

    leader = await exactly_one_leader([a, b], over_s=2 * DURATION_S)
    assert leader is a
    lease = kube.lease(LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "conductor-a_1"
    assert lease["spec"]["leaseDurationSeconds"] == DURATION_S
    assert kube.count("lease-update") >= 4  # renewing every ~1/3 of the duration

    # The leader dies: it stops renewing and never releases.
    await a.stop(release=False)
    lease = kube.lease(LEASE)
    assert lease is not None
    ran_out = datetime.fromisoformat(lease["spec"]["renewTime"]) + timedelta(seconds=DURATION_S)
    await wait_for(lambda: b.is_leader, within=DURATION_S + 2)

    lease = kube.lease(LEASE)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "conductor-b_1"
    assert lease["spec"]["leaseTransitions"] == 1
    # Not before the dead leader's lease ran out, and at the follower's next attempt after that
    # (the stand-in stamps the Lease: these are the API's times, not the test's).
    acquired = datetime.fromisoformat(lease["spec"]["acquireTime"])
    assert ran_out <= acquired <= ran_out + timedelta(seconds=b.period_s + 1)


async def test_a_stopping_leader_releases_at_once(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    changes = Changes()
    a = lease_elector(api, "conductor-a_1", on_change=changes)
    b = lease_elector(api, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()
    await wait_for(lambda: b.holder == a.identity, within=10)  # b has read the Lease: it follows

    await a.stop()
    assert not a.is_leader
    released = kube.lease(LEASE)
    assert released is not None
    assert released["spec"].get("holderIdentity") is None  # handed back, not left to run out
    await wait_for(lambda: b.is_leader, within=DURATION_S)
    taken = kube.lease(LEASE)
    assert taken is not None
    # No need to wait the lease out: taken before the released one would have run out.
    ran_out = datetime.fromisoformat(released["spec"]["renewTime"]) + timedelta(seconds=DURATION_S)
    assert datetime.fromisoformat(taken["spec"]["acquireTime"]) < ran_out
    await asyncio.sleep(0)  # one turn of the loop: the change callback has run
    assert changes.seen == [True, False]


async def test_a_conflict_costs_the_leadership(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    """Another holder writes the Lease between our read and our update: 409, not the leader."""
    changes = Changes()
    a = lease_elector(api, "conductor-a_1", on_change=changes)
    electors.append(a)
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)

    kube.inject(Fault("lease-update", steal_by="intruder_9"))
    await wait_for(lambda: not a.is_leader, within=DURATION_S)
    await wait_for(lambda: a.holder == "intruder_9", within=DURATION_S)
    # The intruder never renews: its lease runs out and a takes over again.
    await wait_for(lambda: a.is_leader, within=DURATION_S + 2)
    await asyncio.sleep(0)  # one turn of the loop: the change callback has run
    assert changes.seen == [True, False, True]
    lease = kube.lease(LEASE)
    assert lease is not None
    assert lease["spec"]["leaseTransitions"] == 1


async def test_one_failed_renewal_does_not_cost_the_leadership(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    changes = Changes()
    a = lease_elector(api, "conductor-a_1", on_change=changes)
    electors.append(a)
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    kube.inject(Fault("lease-update", status=500))
    await asyncio.sleep(DURATION_S)  # a whole lease past the failed renewal
    assert a.is_leader
    assert changes.seen == [True]


async def test_a_leader_that_cannot_renew_steps_down_before_its_lease_runs_out(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    changes = Changes()
    a = lease_elector(api, "conductor-a_1", on_change=changes)
    b = lease_elector(api, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()
    await wait_for(lambda: b.holder == a.identity, within=10)  # b has read the Lease: it follows

    kube.inject(Fault("lease-update", status=500, times=None))  # nobody can write any more
    # The replica is told by an awaited callback, which runs just after the flag turns. When
    # is asserted below, against the Lease itself: this bound only ends a wait gone wrong (a
    # loaded machine runs the deadline's timer and the callback late).
    await wait_for(
        lambda: changes.seen == [True, False],
        within=3 * DURATION_S,
        explain=lambda: f"told {changes.seen}, leader {a.is_leader}, Lease {kube.lease(LEASE)}",
    )
    assert not a.is_leader
    # It told its replica to stop reaping while its last renewal (stamped by the API) still
    # held the Lease: nobody else could have been leading yet.
    lease = kube.lease(LEASE)
    assert lease is not None and lease["spec"]["holderIdentity"] == a.identity
    ran_out = datetime.fromisoformat(lease["spec"]["renewTime"]) + timedelta(seconds=DURATION_S)
    assert changes.at[-1] < ran_out
    assert not b.is_leader  # b could not write either

    kube.clear_faults()
    await wait_for(lambda: a.is_leader or b.is_leader, within=DURATION_S + 2)
    await exactly_one_leader([a, b], over_s=1.0)


async def test_an_unreachable_api_leaves_a_follower_a_follower(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    kube.inject(Fault("lease-get", status=403, times=None))
    a = lease_elector(api, "conductor-a_1")
    electors.append(a)
    await a.start()
    await asyncio.sleep(DURATION_S / 2)  # several attempts, each refused
    assert not a.is_leader
    assert kube.lease(LEASE) is None
    # Once it has failed for as long as a leader may go without renewing, it says so.
    await wait_for(lambda: a.trouble is not None, within=DURATION_S)
    assert a.trouble is not None and "403" in a.trouble
    kube.clear_faults()
    await wait_for(lambda: a.is_leader, within=DURATION_S)
    assert a.trouble is None


async def test_slow_api_answers_do_not_extend_leadership(
    kube: KubeStandIn, api: client.ApiClient, electors: list[Elector]
) -> None:
    a = lease_elector(api, "conductor-a_1")
    electors.append(a)
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    kube.inject(Fault("lease-get", delay=DURATION_S, times=None))  # beyond the request timeout
    await wait_for(lambda: not a.is_leader, within=DURATION_S)
    kube.clear_faults()
    await wait_for(lambda: a.is_leader, within=DURATION_S * 2)


def test_lease_action_is_pure() -> None:
    now = datetime(2026, 5, 16, tzinfo=UTC)

    def record(holder: str | None, renewed_s_ago: float) -> kubernetes.LeaseRecord:
        renewed = now - timedelta(seconds=renewed_s_ago)
        return kubernetes.LeaseRecord(LEASE, "7", holder, 15, renewed, renewed, 3)

    assert lease_action(None, identity="me", now=now) is LeaseAction.CREATE
    assert lease_action(record("me", 100), identity="me", now=now) is LeaseAction.RENEW
    assert lease_action(record("you", 14.9), identity="me", now=now) is LeaseAction.FOLLOW
    assert lease_action(record("you", 15), identity="me", now=now) is LeaseAction.TAKE_OVER
    assert lease_action(record(None, 0), identity="me", now=now) is LeaseAction.TAKE_OVER


def test_names_and_identities() -> None:
    assert lease_name("default") == "rig-conductor-reaper"
    assert lease_name("Team_A") == "rig-conductor-reaper-team-a"
    # Host and pid, and unique to the process start: two containers sharing a host name and
    # a pid are still two holders.
    environ = {"HOSTNAME": "conductor-0"}
    first, second = replica_identity(environ), replica_identity(environ)
    assert first.startswith("conductor-0_") and second.startswith("conductor-0_")
    assert first != second


def test_make_elector_picks_the_backend(
    api: client.ApiClient, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(k8s_namespace="agents")
    assert isinstance(make_elector(settings=settings, api=api), LeaseElector)
    assert isinstance(make_elector(settings=settings, api=None), LeaseRowElector)


# --- the lease row in PostgreSQL ---------------------------------------------------------------

ROW_DURATION_S = 1.5  # renewals every 0.5 s


def row_elector(database_url: str, identity: str, **kwargs: object) -> LeaseRowElector:
    return LeaseRowElector(
        database_url=database_url,
        tenant=kwargs.pop("tenant", "default"),  # type: ignore[arg-type]
        identity=identity,
        lease_duration_s=ROW_DURATION_S,
        **kwargs,  # type: ignore[arg-type]
    )


async def lease_row(engine: AsyncEngine, tenant: str = "default") -> dict[str, object]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT *, now() AS db_now FROM reaper_lease WHERE tenant = :t"), {"t": tenant}
            )
        ).one()
    return dict(row._mapping)


def terminate(database_url: str, application_name: str) -> int:
    """End the sessions of one elector (a failover, an admin); how many there were."""
    conninfo = make_url(database_url).set(drivername="postgresql")
    with psycopg.connect(conninfo.render_as_string(hide_password=False), autocommit=True) as conn:
        cursor = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application_name,),
        )
        row = cursor.fetchone()
        return int(row[0]) if row else 0


async def test_lease_row_one_leader_and_a_takeover_after_the_leader_dies(
    engine: AsyncEngine, database_url: str, electors: list[Elector]
) -> None:
    changes = Changes()
    a = row_elector(database_url, "conductor-a_1", on_change=changes)
    b = row_elector(database_url, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()

    leader = await exactly_one_leader([a, b], over_s=2 * ROW_DURATION_S)
    assert leader is a
    assert b.holder == "conductor-a_1"
    row = await lease_row(engine)
    assert row["holder"] == "conductor-a_1"
    # Renewed every ~1/3 of the duration, each time for the whole duration from PostgreSQL's now.
    assert row["renewed_at"] > row["acquired_at"]  # type: ignore[operator]
    assert row["expires_at"] - row["renewed_at"] == timedelta(seconds=ROW_DURATION_S)  # type: ignore[operator]

    # The leader dies: it stops renewing and never releases.
    await a.stop(release=False)
    expired = (await lease_row(engine))["expires_at"]
    await wait_for(lambda: b.is_leader, within=ROW_DURATION_S + 2)
    row = await lease_row(engine)
    assert row["holder"] == "conductor-b_1"
    # Not before the dead leader's lease ran out, and at the follower's next attempt after that
    # (PostgreSQL's times, not the test's).
    assert expired <= row["acquired_at"] <= expired + timedelta(seconds=b.period_s + 1)  # type: ignore[operator]
    assert changes.seen == [True, False]


async def test_a_stopping_lease_row_leader_releases_at_once(
    engine: AsyncEngine, database_url: str, electors: list[Elector]
) -> None:
    a, b = row_elector(database_url, "conductor-a_1"), row_elector(database_url, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()
    await wait_for(lambda: b.holder == a.identity, within=10)  # b has tried: it follows

    await a.stop()
    assert not a.is_leader
    released = await lease_row(engine)
    assert released["holder"] is None  # handed back, not left to run out
    would_run_out = released["renewed_at"] + timedelta(seconds=ROW_DURATION_S)  # type: ignore[operator]
    await wait_for(lambda: b.is_leader, within=ROW_DURATION_S)
    # No need to wait the lease out: taken before a's last renewal would have run out.
    assert (await lease_row(engine))["acquired_at"] < would_run_out


async def test_a_lost_connection_does_not_cost_the_lease_row_leadership(
    engine: AsyncEngine,
    database_url: str,
    electors: list[Elector],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The leader's connection is cut (a failover, an admin, a pooler restart): nothing was kept
    in it, so the attempt that finds it cut is made again at once on a new connection and
    renews the same lease. No failed attempt is counted: a retry period later would leave only
    the rest of the renew deadline, which a loaded machine can miss."""
    caplog.set_level(logging.INFO, logger="rig_conductor.reaper.leader")

    def cuts() -> int:
        return sum("its connection was cut" in r.getMessage() for r in caplog.records)

    changes = Changes()
    a = row_elector(database_url, "conductor-a_1", on_change=changes)
    b = row_elector(database_url, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()
    session = f"rig-conductor leader {a.identity}"
    for cut in range(1, 4):
        assert await asyncio.to_thread(terminate, database_url, session)
        await exactly_one_leader([a, b], over_s=ROW_DURATION_S / 2)
        # The next cut needs the new session: wait for the attempt that found this one cut.
        await wait_for(lambda: cuts() == cut, within=10)  # noqa: B023 - awaited in this turn
    assert a.is_leader
    assert changes.seen == [True]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_lease_row_leader_that_cannot_renew_steps_down_before_its_lease_runs_out(
    engine: AsyncEngine, database_url: str, electors: list[Elector]
) -> None:
    changes = Changes()
    a = row_elector(database_url, "conductor-a_1", on_change=changes)
    b = row_elector(database_url, "conductor-b_1")
    electors += [a, b]
    await a.start()
    await wait_for(lambda: a.is_leader, within=5)
    await b.start()
    await wait_for(lambda: b.holder == a.identity, within=10)  # b has tried: it follows

    # Another session locks the table: every attempt of both hangs until it times out.
    async with engine.connect() as blocker:
        await blocker.execute(text("LOCK TABLE reaper_lease IN ACCESS EXCLUSIVE MODE"))
        held = (await blocker.execute(text("SELECT holder, expires_at FROM reaper_lease"))).one()
        # The replica is told on the loop's next turn after the elector lets go; when, against
        # the lease, is checked below (the bound here only stops a test that would hang).
        await wait_for(lambda: changes.seen == [True, False], within=15)
        assert not a.is_leader
        # It stopped reaping before its last renewal (PostgreSQL's stamp) ran out.
        assert held.holder == a.identity and changes.at[-1] < held.expires_at
        assert not b.is_leader  # b could not write either
        await blocker.rollback()
    await wait_for(lambda: a.is_leader or b.is_leader, within=15)
    await never_two_leaders([a, b], over_s=1.0)


async def test_lease_rows_are_per_tenant(
    engine: AsyncEngine, database_url: str, electors: list[Elector]
) -> None:
    a = row_elector(database_url, "a", tenant="team-a")
    b = row_elector(database_url, "b", tenant="team-b")
    electors += [a, b]
    await a.start()
    await b.start()
    await wait_for(lambda: a.is_leader and b.is_leader, within=5)


async def test_an_unreachable_database_is_no_leadership(electors: list[Elector]) -> None:
    a = row_elector("postgresql+psycopg://nobody@127.0.0.1:1/none", "a")
    electors.append(a)
    await a.start()
    await asyncio.sleep(ROW_DURATION_S)  # a whole lease of attempts, each refused
    assert not a.is_leader
    # The schedule counts its scans as failed: nobody here can tell who reaps (once it has
    # failed for as long as a leader may go without renewing).
    await wait_for(lambda: a.trouble is not None, within=10)
    assert a.trouble is not None and a.trouble.startswith("PostgreSQL unavailable: ")
