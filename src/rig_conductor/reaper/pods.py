"""Kubernetes evidence for the reaper: one pod tracker shared by the per-scan listing and the
watch. The watch runs only while this replica leads."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from kubernetes.client import ApiClient
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.domain import PodName
from rig_conductor.reaper import podwatch
from rig_conductor.settings import Settings


class PodEvidence:
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

    async def _gone(self, pod: PodName) -> None:
        if self.on_gone is not None:
            await self.on_gone(pod)

    async def follow(self, leading: bool) -> None:
        """Watch while leading, stop watching when not."""
        if leading and not self._watch.running:
            await self._watch.start()
        elif not leading and self._watch.running:
            await self._watch.stop()
