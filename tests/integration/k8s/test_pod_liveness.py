"""Pod evidence for scans, through the real kubernetes client against the API stand-in."""

from __future__ import annotations

import pytest
from kubernetes import client

from rig_conductor.adapters import kubernetes
from rig_conductor.domain import ConsumerName, PodName, PodState
from rig_conductor.reaper.podwatch import PodLiveness, PodTracker

from .standin import Fault, KubeStandIn

AGENTS = {"app": "rig-agent"}
SELECTOR = "app=rig-agent"


def liveness(api: client.ApiClient) -> PodLiveness:
    return PodLiveness(api=api, namespace="agents", label_selector=SELECTOR, timeout=(1.0, 0.5))


async def test_pod_states_by_phase_and_memory(kube: KubeStandIn, api: client.ApiClient) -> None:
    for name, phase in [
        ("pending-0", "Pending"),
        ("running-0", "Running"),
        ("terminating-0", "Running"),
        ("succeeded-0", "Succeeded"),
        ("failed-0", "Failed"),
        ("lost-node-0", "Unknown"),
        ("deleted-0", "Running"),
    ]:
        kube.add_pod(name, namespace="agents", labels=AGENTS, phase=phase)
    kube.add_pod("other-app-0", namespace="agents", labels={"app": "web"})
    kube.add_pod("other-ns-0", namespace="default", labels=AGENTS)
    pods = liveness(api)

    first = (await pods.scan()).states
    kube.terminate("terminating-0", namespace="agents")
    kube.delete("deleted-0", namespace="agents")
    second = (await pods.scan()).states

    assert first[ConsumerName("deleted-0")] is PodState.LIVE
    assert dict(second) == {
        "pending-0": PodState.LIVE,
        "running-0": PodState.LIVE,
        "terminating-0": PodState.LIVE,  # deletionTimestamp set, containers still running
        "succeeded-0": PodState.GONE,
        "failed-0": PodState.GONE,
        "lost-node-0": PodState.UNKNOWN,  # phase Unknown: the node stopped reporting
        "deleted-0": PodState.GONE,  # seen before, now absent
    }
    # Never seen as a pod of this namespace + selector: no answer, so UNKNOWN for the reaper.
    for stranger in ("other-app-0", "other-ns-0", "agent-outside-the-cluster"):
        assert stranger not in second


async def test_a_consumer_never_seen_as_a_pod_stays_unknown(
    kube: KubeStandIn, api: client.ApiClient
) -> None:
    pods = liveness(api)
    assert (await pods.scan()).states == {}
    kube.add_pod("late-0", namespace="agents", labels=AGENTS)
    assert (await pods.scan()).states[ConsumerName("late-0")] is PodState.LIVE


@pytest.mark.parametrize(
    "fault",
    [
        Fault("pods-list", status=403),
        Fault("pods-list", status=401),
        Fault("pods-list", status=500),
        Fault("pods-list", delay=1.5),  # longer than the 0.5 s read timeout
    ],
    ids=["forbidden", "unauthorised", "server-error", "timeout"],
)
async def test_a_failed_list_is_unknown_for_everyone(
    kube: KubeStandIn, api: client.ApiClient, fault: Fault, caplog: pytest.LogCaptureFixture
) -> None:
    kube.add_pod("a-0", namespace="agents", labels=AGENTS)
    kube.add_pod("b-0", namespace="agents", labels=AGENTS)
    pods = liveness(api)
    assert set((await pods.scan()).states) == {"a-0", "b-0"}
    kube.delete("a-0", namespace="agents")
    kube.delete("b-0", namespace="agents")
    kube.inject(fault)

    assert (await pods.scan()).states == {}  # not GONE for a-0 and b-0: nobody knows
    assert "pod evidence is unknown for this scan" in caplog.text
    # The next good list reports what really happened.
    assert dict((await pods.scan()).states) == {"a-0": PodState.GONE, "b-0": PodState.GONE}


async def test_a_failure_carries_the_http_status(kube: KubeStandIn, api: client.ApiClient) -> None:
    kube.inject(Fault("pods-list", status=503))
    with pytest.raises(kubernetes.KubernetesUnavailable) as failure:
        kubernetes.list_pods(api, namespace="agents", label_selector=SELECTOR)
    assert failure.value.status == 503


async def test_list_pages_through_large_namespaces(
    kube: KubeStandIn, api: client.ApiClient
) -> None:
    for i in range(23):
        kube.add_pod(f"agent-{i:02d}", namespace="agents", labels=AGENTS)
    listing = kubernetes.list_pods(api, namespace="agents", label_selector=SELECTOR, page_size=5)
    assert [p.name for p in listing.pods] == [f"agent-{i:02d}" for i in range(23)]
    assert kube.count("pods-list") == 5
    assert listing.resource_version


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=rig-agent", {"a", "b"}),
        ("app==rig-agent,tier=gpu", {"b"}),
        ("app=rig-agent,tier!=gpu", {"a"}),
        ("tier", {"b", "c"}),
        ("!tier", {"a"}),
        ("tier in (gpu, cpu)", {"b", "c"}),
        ("app=rig-agent,tier notin (gpu)", {"a"}),
        ("", {"a", "b", "c"}),
    ],
)
async def test_label_selectors(
    kube: KubeStandIn, api: client.ApiClient, selector: str, expected: set[str]
) -> None:
    kube.add_pod("a", labels={"app": "rig-agent"})
    kube.add_pod("b", labels={"app": "rig-agent", "tier": "gpu"})
    kube.add_pod("c", labels={"app": "web", "tier": "cpu"})
    listing = kubernetes.list_pods(api, namespace="default", label_selector=selector)
    assert {p.name for p in listing.pods} == expected


def observation(name: str, phase: str = "Running") -> kubernetes.PodObservation:
    return kubernetes.PodObservation(PodName(name), phase, deleting=False)


def test_a_list_older_than_a_watch_event_cannot_make_a_live_pod_gone() -> None:
    """The scan's list and the watch race: the newer, less destructive answer wins."""
    tracker = PodTracker()
    tracker.apply_listing(kubernetes.PodListing("1", (observation("a-0"),)), since=0)
    since = tracker.mark()  # a scan's list request goes out ...
    tracker.apply_event(kubernetes.PodEvent("DELETED", "2", observation("a-0")))
    tracker.apply_event(kubernetes.PodEvent("ADDED", "3", observation("a-0", "Pending")))
    # ... and comes back from before the delete and the re-creation: a-0 absent.
    tracker.apply_listing(kubernetes.PodListing("1", ()), since=since)
    assert tracker.states() == {"a-0": PodState.LIVE}


def test_the_memory_of_gone_pods_is_bounded() -> None:
    tracker = PodTracker(memory=3)
    tracker.apply_listing(
        kubernetes.PodListing("1", tuple(observation(f"p-{i}") for i in range(3))), since=0
    )
    for i in range(3):
        tracker.apply_event(kubernetes.PodEvent("DELETED", str(2 + i), observation(f"p-{i}")))
    tracker.apply_event(kubernetes.PodEvent("ADDED", "9", observation("q-0")))
    # The oldest gone pod is forgotten first: it becomes UNKNOWN, never wrongly LIVE.
    assert tracker.states() == {
        "p-1": PodState.GONE,
        "p-2": PodState.GONE,
        "q-0": PodState.LIVE,
    }
