"""The pod watch: on_gone as soon as a pod is deleted or finishes, through drops and 410s."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes import client

from rig_conductor.domain import PodName, PodState
from rig_conductor.reaper.podwatch import OnGone, PodWatch

from ..helpers import wait_for
from .standin import Fault, KubeStandIn

LABELS = {"app": "rig-agent"}


class Recorder:
    """An on_gone callback that records names and the perf_counter() of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[PodName, float]] = []

    async def __call__(self, name: PodName) -> None:
        self.calls.append((name, time.perf_counter()))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


WatchFactory = Callable[..., PodWatch]


@pytest.fixture
async def watches(
    api: client.ApiClient,
) -> AsyncIterator[WatchFactory]:
    started: list[PodWatch] = []

    def make(on_gone: OnGone, **kwargs: object) -> PodWatch:
        options: dict[str, object] = {
            "api": api,
            "namespace": "agents",
            "label_selector": "app=rig-agent",
            "on_gone": on_gone,
            "list_timeout": (1.0, 2.0),
            "backoff_initial_s": 0.1,
            "backoff_max_s": 1.0,
        }
        options.update(kwargs)
        watch = PodWatch(**options)  # type: ignore[arg-type]
        started.append(watch)
        return watch

    yield make
    for watch in started:
        await watch.stop()


async def watching(kube: KubeStandIn, watch: PodWatch, *, connections: int = 1) -> None:
    await watch.start()
    await wait_for(lambda: watch.lists >= 1 and kube.open_watches() >= connections, within=5)


async def test_on_gone_for_deleted_and_failed_pods_only(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    for name in ("deleted-0", "failed-0", "succeeded-0", "terminating-0", "evicted-0"):
        kube.add_pod(name, namespace="agents", labels=LABELS)
    kube.add_pod("done-before-0", namespace="agents", labels=LABELS, phase="Succeeded")
    kube.add_pod("web-0", namespace="agents", labels={"app": "web"})
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    kube.terminate("terminating-0", namespace="agents")  # still live: no call
    kube.set_phase("failed-0", "Failed", namespace="agents")
    kube.set_phase("succeeded-0", "Succeeded", namespace="agents")
    kube.delete("deleted-0", namespace="agents")
    kube.set_phase("evicted-0", "Failed", namespace="agents")
    kube.delete("evicted-0", namespace="agents")  # already gone: no second call
    kube.delete("web-0", namespace="agents")  # not selected
    kube.bookmark()
    await wait_for(lambda: len(gone.calls) >= 4, within=5)
    await asyncio.sleep(0.2)  # time for a call that must not come (a second for evicted-0)

    assert gone.names == ["failed-0", "succeeded-0", "deleted-0", "evicted-0"]
    states = watch.tracker.states()
    assert states["terminating-0"] is PodState.LIVE
    assert states["done-before-0"] is PodState.GONE  # finished before we started: no call


async def test_survives_a_dropped_connection_without_relisting(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    kube.add_pod("b-0", namespace="agents", labels=LABELS)
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    kube.drop_watches()
    kube.delete("a-0", namespace="agents")  # while disconnected
    await wait_for(lambda: gone.names == ["a-0"], within=5)
    await wait_for(lambda: kube.open_watches() == 1, within=5)
    kube.delete("b-0", namespace="agents")
    await wait_for(lambda: gone.names == ["a-0", "b-0"], within=5)

    assert watch.lists == 1  # resumed from its resourceVersion: no relist needed
    assert kube.count("pods-watch") >= 2


async def test_relists_on_410_and_catches_up_on_missed_deletions(
    kube: KubeStandIn, watches: WatchFactory, caplog: pytest.LogCaptureFixture
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    kube.add_pod("b-0", namespace="agents", labels=LABELS)
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    caplog.set_level(logging.INFO, logger="rig_conductor")
    # A deletion the watch never hears of (compacted away while it was disconnected), so
    # resuming fails with 410 and only a relist can tell; the first relist fails too.
    with kube.cond:
        del kube.pods[("agents", "a-0")]
    kube.inject(Fault("pods-list", status=500))
    kube.drop_watches()
    kube.expire_watches()
    await wait_for(lambda: gone.names == ["a-0"], within=5)
    assert watch.lists == 2
    assert "Pod watch expired (410 Gone): listing again" in caplog.text

    await wait_for(lambda: kube.open_watches() == 1, within=5)
    kube.set_phase("b-0", "Failed", namespace="agents")
    await wait_for(lambda: gone.names == ["a-0", "b-0"], within=5)


async def test_an_error_event_410_on_an_open_watch_relists(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    kube.expire_watches()  # ERROR {"code": 410} on the open stream
    await wait_for(lambda: watch.lists == 2 and kube.open_watches() == 1, within=5)
    kube.delete("a-0", namespace="agents")
    await wait_for(lambda: gone.names == ["a-0"], within=5)


async def test_an_http_410_on_resuming_relists(kube: KubeStandIn, watches: WatchFactory) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    kube.inject(Fault("pods-watch", status=410))  # the API answers the resume itself with 410
    kube.drop_watches()
    await wait_for(lambda: watch.lists == 2 and kube.open_watches() == 1, within=5)
    kube.delete("a-0", namespace="agents")
    await wait_for(lambda: gone.names == ["a-0"], within=5)


async def test_backs_off_while_the_api_refuses_and_recovers(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    kube.inject(Fault("pods-list", status=403, times=4))
    gone = Recorder()
    watch = watches(gone, backoff_initial_s=0.05, backoff_max_s=0.2)
    await watching(kube, watch)
    lists = kube.arrivals("pods-list")
    assert len(lists) == 5
    # The pauses between the tries, as the stand-in saw them: each at least its backoff.
    pauses = [later - earlier for earlier, later in itertools.pairwise(lists)]
    assert all(pause >= least for pause, least in zip(pauses, (0.05, 0.1, 0.2, 0.2), strict=True))
    kube.delete("a-0", namespace="agents")
    await wait_for(lambda: gone.names == ["a-0"], within=5)


async def test_stops_promptly_mid_watch_and_mid_backoff(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    # Promptly: long before the watch's own timeout (300 s) or the backoff (30 s) would end.
    idle = watches(Recorder(), watch_timeout_s=300)
    await watching(kube, idle)
    await asyncio.wait_for(idle.stop(), timeout=10)
    assert not idle.running

    kube.inject(Fault("pods-list", status=500, times=None))
    failing = watches(Recorder(), backoff_initial_s=30, backoff_max_s=30)
    await failing.start()
    await wait_for(lambda: kube.count("pods-list") >= 1, within=5)
    await asyncio.wait_for(failing.stop(), timeout=10)
    assert not failing.running


async def test_on_gone_failures_do_not_stop_the_watch(
    kube: KubeStandIn, watches: WatchFactory, caplog: pytest.LogCaptureFixture
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=LABELS)
    kube.add_pod("b-0", namespace="agents", labels=LABELS)
    seen: list[str] = []

    async def flaky(name: PodName) -> None:
        seen.append(name)
        if name == "a-0":
            raise RuntimeError("targeted reclaim failed")

    watch = watches(flaky)
    await watching(kube, watch)
    kube.delete("a-0", namespace="agents")
    kube.delete("b-0", namespace="agents")
    await wait_for(lambda: seen == ["a-0", "b-0"], within=5)
    assert "on_gone(a-0) failed" in caplog.text


async def test_a_burst_of_deletions_reaches_on_gone_once_each(
    kube: KubeStandIn, watches: WatchFactory
) -> None:
    n = 200
    for i in range(n):
        kube.add_pod(f"agent-{i:03d}", namespace="agents", labels=LABELS)
    gone = Recorder()
    watch = watches(gone)
    await watching(kube, watch)

    for i in range(n):
        kube.delete(f"agent-{i:03d}", namespace="agents")
        await asyncio.sleep(0.005)  # a burst of separate events, not one batch
    await wait_for(lambda: len(gone.calls) == n, within=10)
    assert sorted(gone.names) == [f"agent-{i:03d}" for i in range(n)]  # each once
    assert watch.lists == 1  # from the one watch, no relist
