"""Pod evidence for the reaper: what Kubernetes says about the pods consumers are named after.

- `PodTracker` remembers, in memory, every pod this process has positively seen in the
  namespace + label selector, and turns list and watch answers into PodState per pod name.
- `PodLiveness.scan()` lists the pods for one reaper scan and returns the `Pods` answer that
  `cycle.reap_once` takes. A failed, forbidden or timed-out list returns an empty, unlisted
  answer: UNKNOWN for every consumer, never GONE, so a failed call cannot cause a mass reclaim.
- `PodWatch` watches the same pods in a worker thread and calls `on_gone(pod_name)` on the event
  loop as soon as a pod is deleted or finishes, for a targeted reclaim between scans.

The rules (reaper rules 3-4, docs/rules.md); what one answer about a pod means, and which of
two racing answers wins, are decided in policy/pods.py:
- a pod absent from a successful list is GONE when it was positively seen as a pod of this
  namespace + selector before: by this process (in memory, bounded, oldest gone pods first) or
  by any conductor of the tenant (the `pods_seen` table: a restart or a new leader remembers).
  A consumer holding entries that neither the list nor that memory knows is looked up by name:
  a 404 makes it ABSENT, which the policy counts as gone unless the consumer heartbeats by its
  own name (an agent outside the cluster has no pod). A failed GET leaves it UNKNOWN. Each 404
  is remembered (bounded, in memory) until a list shows the pod: a consumer found absent stays
  absent once it holds nothing, so the entries moved off it can never be moved back to it.
- Every other consumer a successful list does not show is MISSING: not gone, and never a
  reclaim target unless it heartbeats by its own name (reaper rule 5, docs/rules.md).

This module decides nothing about entries; it only supplies evidence and deletes empty consumers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.adapters import kubernetes
from rig_conductor.adapters.postgres import pods as pods_seen
from rig_conductor.domain import ConsumerName, PodName, Pods, PodState
from rig_conductor.policy import pods
from rig_conductor.settings import Settings

logger = logging.getLogger(__name__)

OnGone = Callable[[PodName], Awaitable[object]]

PROBE_LIMIT = 100  # GETs by name per scan, for consumers the pod list does not show


def api_client(settings: Settings, *, environ: Mapping[str, str]) -> k8s_client.ApiClient | None:
    """The Kubernetes client per RIG_K8S_ENABLED, or None when Kubernetes is off.

    `auto` without a usable configuration logs a warning and runs without pod evidence;
    `true` raises `kubernetes.KubernetesConfigError` (an operator mistake, for exit 2).
    """
    if not kubernetes.enabled(settings.k8s_enabled, environ=environ):
        return None
    try:
        return kubernetes.api_client(environ=environ)
    except kubernetes.KubernetesConfigError as exc:
        if settings.k8s_enabled == "true":
            raise
        logger.warning("RIG_K8S_ENABLED=auto: Kubernetes configuration unusable, off: %s", exc)
        return None


class PodTracker:
    """Pods positively seen in one namespace + selector, with their latest state.

    Touched from the event loop thread only. Every observation gets a sequence stamp, so a list
    that was in flight while the watch reported something newer cannot overwrite it with an
    older, more destructive answer.
    """

    def __init__(self, *, memory: int = 10_000) -> None:
        self._states: OrderedDict[PodName, PodState] = OrderedDict()
        self._stamps: dict[PodName, int] = {}
        self._seq = 0
        self._memory = memory
        self._synced = False

    def mark(self) -> int:
        """A stamp to take just before a list request is sent; pass it to `apply_listing`."""
        return self._seq

    def states(self) -> dict[ConsumerName, PodState]:
        """Pod name (= consumer name) -> state, for every pod seen. Others are UNKNOWN."""
        return {ConsumerName(name): state for name, state in self._states.items()}

    def apply_listing(self, listing: kubernetes.PodListing, *, since: int) -> list[PodName]:
        """Take in a successful list whose request began at stamp `since`.

        Seen pods missing from it are GONE. Returns the pods that turned GONE: none on the very
        first list (pods that finished before this process started are not news).
        """
        listed = {pod.name: pods.pod_state(pod.phase) for pod in listing.pods}
        for name in self._states:
            listed.setdefault(name, PodState.GONE)
        turned: list[PodName] = []
        for name, state in listed.items():
            if self._stamps.get(name, -1) > since:
                # The watch said something after this list was requested: keep the safer answer.
                state = pods.safer(state, self._states[name])
            if self._record(name, state):
                turned.append(name)
        self._synced = True
        self._forget()
        return turned

    def apply_event(self, event: kubernetes.PodEvent) -> PodName | None:
        """Take in one watch event; returns the pod's name if it turned GONE with it."""
        pod = event.pod
        if pod is None:
            return None
        state = pods.event_state(event.type, pod.phase)
        turned = self._record(pod.name, state)
        self._forget()
        return pod.name if turned else None

    def _record(self, name: PodName, state: PodState) -> bool:
        before = self._states.get(name)
        self._seq += 1
        self._states[name] = state
        self._states.move_to_end(name)
        self._stamps[name] = self._seq
        known = before is not None or self._synced
        return known and state is PodState.GONE and before is not PodState.GONE

    def _forget(self) -> None:
        excess = len(self._states) - self._memory
        if excess <= 0:
            return
        oldest_gone = [n for n, s in self._states.items() if s is PodState.GONE][:excess]
        for name in oldest_gone:
            del self._states[name]
            del self._stamps[name]


class PodLiveness:
    """Pod evidence for reaper scans: one list per scan, remembered in a PodTracker and, with an
    `engine`, in PostgreSQL (so a restarted or new leader knows what was seen before); then a
    GET by name for the consumers holding entries that the list says nothing about."""

    def __init__(
        self,
        *,
        api: k8s_client.ApiClient,
        namespace: str,
        label_selector: str,
        tracker: PodTracker | None = None,
        timeout: kubernetes.Timeout = kubernetes.DEFAULT_TIMEOUT,
        engine: AsyncEngine | None = None,
        tenant: str = "default",
        probe_limit: int = PROBE_LIMIT,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self.tracker = tracker or PodTracker()
        self._timeout = timeout
        self._engine = engine
        self._tenant = tenant
        self._probe_limit = probe_limit
        # The pods of the last successful list; None when the last list failed.
        self._listed: frozenset[PodName] | None = None
        # Pods a GET by name answered 404 for, until a list shows them (oldest first).
        self._absent: OrderedDict[PodName, None] = OrderedDict()
        self._absent_memory = 10_000

    @property
    def listed(self) -> bool:
        """Whether the last list succeeded: then a pod it did not show is missing."""
        return self._listed is not None

    async def scan(self) -> Pods:
        """The `pods` argument for `cycle.reap_once`: the states of the pods and whether the
        list succeeded, as one answer (a scan running beside this one cannot change it); empty
        and unlisted (all UNKNOWN) when the list fails."""
        since = self.tracker.mark()
        try:
            listing = await asyncio.to_thread(
                kubernetes.list_pods,
                self.api,
                namespace=self.namespace,
                label_selector=self.label_selector,
                timeout=self._timeout,
            )
        except kubernetes.KubernetesUnavailable as exc:
            logger.warning(
                "Pod list in namespace %s failed, pod evidence is unknown for this scan: %s",
                self.namespace,
                exc,
            )
            self._listed = None
            return Pods()
        self.tracker.apply_listing(listing, since=since)
        self._listed = frozenset(pod.name for pod in listing.pods)
        for name in self._listed.intersection(self._absent):
            del self._absent[name]
        if self._engine is not None:
            await pods_seen.remember(
                self._engine, tenant=self._tenant, namespace=self.namespace, names=self._listed
            )
        states = self.tracker.states()
        for name in self._absent:
            states.setdefault(ConsumerName(name), PodState.ABSENT)
        return Pods(states, listed=True)

    async def probe(self, consumers: Sequence[ConsumerName]) -> dict[ConsumerName, PodState]:
        """Pod states for consumers the last successful list did not show (at most
        `probe_limit` a scan): GONE when a conductor saw the pod before, else what a GET by
        name says: ABSENT for a 404, the pod's state when it exists. Nothing when the last
        list failed, or for a GET that fails: unknown is never absent."""
        listed = self._listed
        if listed is None:
            return {}
        missing = [c for c in consumers if PodName(c) not in listed][: self._probe_limit]
        found: dict[ConsumerName, PodState] = {}
        if self._engine is not None and missing:
            seen = await pods_seen.seen(
                self._engine, tenant=self._tenant, namespace=self.namespace, names=missing
            )
            found.update(dict.fromkeys((ConsumerName(name) for name in seen), PodState.GONE))
        for consumer in missing:
            if consumer in found:
                continue
            try:
                pod = await asyncio.to_thread(
                    kubernetes.read_pod,
                    self.api,
                    namespace=self.namespace,
                    name=consumer,
                    timeout=self._timeout,
                )
            except kubernetes.KubernetesUnavailable as exc:
                logger.info("Pod %s: GET by name failed, left unknown: %s", consumer, exc)
                continue
            found[consumer] = PodState.ABSENT if pod is None else pods.pod_state(pod.phase)
            self._remember_absent(PodName(consumer), pod is None)
        return found

    def _remember_absent(self, name: PodName, absent: bool) -> None:
        if not absent:
            self._absent.pop(name, None)
            return
        self._absent[name] = None
        self._absent.move_to_end(name)
        while len(self._absent) > self._absent_memory:
            self._absent.popitem(last=False)


@dataclass(frozen=True, slots=True)
class _Listed:
    listing: kubernetes.PodListing
    since: int


class PodWatch:
    """Watches the selected pods and calls `on_gone(name)` when one is deleted or finishes.

    The client is synchronous, so list and watch run in a daemon thread; results cross to the
    event loop through `call_soon_threadsafe` into a queue, and `on_gone` runs on the loop, one
    call at a time. The thread lists, then watches from the list's resourceVersion with
    bookmarks, resumes from the last resourceVersion when a watch ends, relists on 410 Gone, and
    backs off exponentially (capped) on failures. `on_gone` also fires for pods that a relist
    finds gone: deletions missed while disconnected.

    `stop()` returns within `stop_timeout_s`: it sets a flag, shuts the watch socket, and gives
    up on a thread stuck in a list request (that request has its own timeout; the thread is a
    daemon). An `on_gone` call in progress is cancelled.
    """

    def __init__(
        self,
        *,
        api: k8s_client.ApiClient,
        namespace: str,
        label_selector: str,
        on_gone: OnGone,
        tracker: PodTracker | None = None,
        watch_timeout_s: int = 60,
        list_timeout: kubernetes.Timeout = kubernetes.DEFAULT_TIMEOUT,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self.tracker = tracker or PodTracker()
        self._on_gone = on_gone
        self._watch_timeout_s = watch_timeout_s
        # The server ends each watch after watch_timeout_s; a read that waits longer than that
        # is a dead connection.
        self._watch_read_timeout = (list_timeout[0], float(watch_timeout_s) + list_timeout[1])
        self._list_timeout = list_timeout
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._stop_timeout_s = stop_timeout_s
        self._stopping = threading.Event()
        self._watcher: k8s_watch.Watch | None = None
        self._version: str | None = None  # where the watch resumes; None: list first
        self._received = 0  # events in the current watch session
        self._thread: threading.Thread | None = None
        self._consumer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Listed | kubernetes.PodEvent] = asyncio.Queue()
        self.lists = 0  # lists applied: 1 after start, +1 per relist
        self.events = 0  # pod events applied

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("PodWatch already started")
        self._loop = asyncio.get_running_loop()
        self._consumer = asyncio.create_task(self._consume(), name="pod-watch-events")
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()
        logger.info(
            "Watching pods in namespace %s (selector %r)",
            self.namespace,
            self.label_selector or "<all>",
        )

    async def stop(self) -> None:
        self._stopping.set()
        thread = self._thread
        deadline = time.monotonic() + self._stop_timeout_s
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            # Repeated: the watch may open its connection just after a first poke.
            watcher = self._watcher
            if watcher is not None:
                watcher.stop()
            await asyncio.sleep(0.02)
        if thread is not None and thread.is_alive():
            logger.warning(
                "Pod watch thread did not stop within %.1fs; left behind", self._stop_timeout_s
            )
        if self._consumer is not None:
            self._consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._consumer
            self._consumer = None

    # --- event loop side -------------------------------------------------------------------

    async def _consume(self) -> None:
        while True:
            item = await self._queue.get()
            if isinstance(item, _Listed):
                gone = self.tracker.apply_listing(item.listing, since=item.since)
                self.lists += 1
            else:
                turned = self.tracker.apply_event(item)
                gone = [turned] if turned else []
                self.events += 1
            for name in gone:
                await self._notify(name)

    async def _notify(self, name: PodName) -> None:
        logger.info("Pod %s in namespace %s is gone", name, self.namespace)
        try:
            await self._on_gone(name)
        except Exception:
            logger.exception("on_gone(%s) failed", name)

    # --- worker thread side ----------------------------------------------------------------

    def _post(self, item: _Listed | kubernetes.PodEvent) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopping.set()

    def _run(self) -> None:
        initial, ceiling = self._backoff
        delay = initial
        expired_in_a_row = 0
        while not self._stopping.is_set():
            self._received = 0
            pause = 0.0
            try:
                self._session()
                expired_in_a_row = 0
            except kubernetes.ResourceExpired:
                self._version = None
                expired_in_a_row += 1
                logger.info("Pod watch expired (410 Gone): listing again")
                # The first 410 relists at once; a server that keeps answering 410 is backed off.
                pause = 0.0 if expired_in_a_row == 1 else delay
            except kubernetes.KubernetesUnavailable as exc:
                if self._stopping.is_set():
                    break
                delay = initial if self._received else delay  # it worked until it broke
                logger.warning("Pod watch failed, retrying in %.1fs: %s", delay, exc)
                pause = delay
            except Exception:
                logger.exception("Pod watch failed unexpectedly, retrying in %.1fs", delay)
                pause = delay
            if pause:
                self._stopping.wait(pause)
                delay = min(delay * 2, ceiling)
            else:
                delay = initial
        logger.debug("Pod watch thread finished")

    def _session(self) -> None:
        """List when there is no resourceVersion to resume from, then watch once.

        Progress is kept in `self._version` as it is made, so a broken watch resumes where it
        broke, without a relist.
        """
        if self._version is None:
            since = self.tracker.mark()  # an int read: safe from this thread
            listing = kubernetes.list_pods(
                self.api,
                namespace=self.namespace,
                label_selector=self.label_selector,
                timeout=self._list_timeout,
            )
            self._post(_Listed(listing, since))
            self._version = listing.resource_version
        started = time.monotonic()
        watcher = k8s_watch.Watch()
        self._watcher = watcher
        try:
            for event in kubernetes.watch_pods(
                self.api,
                namespace=self.namespace,
                label_selector=self.label_selector,
                resource_version=self._version,
                watcher=watcher,
                timeout_seconds=self._watch_timeout_s,
                timeout=self._watch_read_timeout,
            ):
                if self._stopping.is_set():
                    return
                self._received += 1
                self._version = event.resource_version or self._version
                if event.pod is not None:
                    self._post(event)
        finally:
            self._watcher = None
        quick = time.monotonic() - started < 1.0
        if quick and not self._received and not self._stopping.is_set():
            raise kubernetes.KubernetesUnavailable("the watch closed as soon as it opened")
