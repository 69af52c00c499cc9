"""Kubernetes evidence: one pod tracker shared by the per-scan listing and the watch, and the
one source of pod evidence for the scan, the views and every move by hand
(`operations.evidence.PodSource`). The watch runs only while this replica leads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kubernetes.client import ApiClient
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.domain import ConsumerName, PodName, Pods, PodState
from rig_conductor.reaper import podwatch
from rig_conductor.settings import Settings


class PodEvidence:
    """What Kubernetes says about the agents' pods, asked for the same way by every caller."""

    def __init__(self, settings: Settings, kube: ApiClient, engine: AsyncEngine) -> None:
        namespace, selector = settings.namespace(), settings.k8s_label_selector
        self.tracker = podwatch.PodTracker()
        self.liveness = podwatch.PodLiveness(
            api=kube,
            namespace=namespace,
            label_selector=selector,
            tracker=self.tracker,
            engine=engine,
            tenant=settings.tenant,
        )
        # Called with each pod the watch sees deleted or finished (the reaper scans at once).
        self.on_gone: Callable[[PodName], Awaitable[None]] | None = None
        self._watch = podwatch.PodWatch(
            api=kube,
            namespace=namespace,
            label_selector=selector,
            on_gone=self._gone,
            tracker=self.tracker,
        )

    async def listing(self) -> Pods:
        """The pods listed now: what a scan, and a move by hand, decide on (rules 3 and 5,
        docs/rules.md)."""
        return await self.liveness.scan()

    def known(self) -> Pods:
        """What the lists and the watch said last, without asking Kubernetes: the pod a watch
        saw go, before the next list; and the views."""
        return Pods(self.tracker.states(), listed=self.liveness.listed)

    async def probe(self, consumers: list[ConsumerName]) -> dict[ConsumerName, PodState]:
        """The pods of `consumers` the last list did not show, looked up by name."""
        return await self.liveness.probe(consumers)

    async def _gone(self, pod: PodName) -> None:
        if self.on_gone is not None:
            await self.on_gone(pod)

    async def follow(self, leading: bool) -> None:
        """Watch while leading, stop watching when not."""
        if leading and not self._watch.running:
            await self._watch.start()
        elif not leading and self._watch.running:
            await self._watch.stop()
