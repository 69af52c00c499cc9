"""Kubernetes API I/O: client configuration, pod list and watch, Lease get/create/replace.

Thin and synchronous, like the official client it wraps: callers run these functions in a
worker thread. Every function takes keyword arguments and returns plain data. Every failure
(an API error, 401/403, a timeout, a dropped connection, a malformed body) comes out as
`KubernetesUnavailable`, never as an empty answer, so no caller can mistake a failed or
forbidden list for "no pods". What a pod's phase means for liveness is not decided here.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from rig_conductor.domain import PodName

logger = logging.getLogger(__name__)

# (connect, read) seconds for one request. A list of a few thousand pods reads well within this.
DEFAULT_TIMEOUT: tuple[float, float] = (5.0, 15.0)
LIST_PAGE = 500
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_GONE = 410

Timeout = tuple[float, float]


class KubernetesUnavailable(Exception):
    """A call failed: the answer is unknown. `status` is the HTTP status when there was one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ResourceExpired(KubernetesUnavailable):
    """410 Gone: the resourceVersion a watch resumed from was compacted away; list again."""


class Conflict(Exception):
    """409: somebody else created or updated the object first. An answer, not a failure."""


class KubernetesConfigError(Exception):
    """Neither in-cluster configuration nor a usable KUBECONFIG was found."""


@dataclass(frozen=True, slots=True)
class PodObservation:
    """The facts about one pod that liveness needs."""

    name: PodName
    # Pending, Running, Succeeded, Failed, Unknown; empty when the API sent no status yet.
    phase: str
    # metadata.deletionTimestamp is set: the pod is terminating but its containers may still run.
    deleting: bool


@dataclass(frozen=True, slots=True)
class PodListing:
    """One consistent list of the selected pods, and the resourceVersion to watch from."""

    resource_version: str
    pods: tuple[PodObservation, ...]


@dataclass(frozen=True, slots=True)
class PodEvent:
    """One watch event. `pod` is None for a BOOKMARK, which only advances the resourceVersion."""

    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    resource_version: str
    pod: PodObservation | None


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """spec of a coordination.k8s.io/v1 Lease, with the resourceVersion it was read at."""

    name: str
    resource_version: str
    holder: str | None
    duration_s: int | None
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int


def enabled(mode: str, *, environ: Mapping[str, str]) -> bool:
    """RIG_K8S_ENABLED: `true`, `false`, or `auto` (on when KUBERNETES_SERVICE_HOST is set)."""
    if mode == "auto":
        return bool(environ.get("KUBERNETES_SERVICE_HOST"))
    return mode == "true"


def api_client(
    *,
    configuration: client.Configuration | None = None,
    environ: Mapping[str, str] | None = None,
) -> client.ApiClient:
    """An ApiClient: the given configuration, else in-cluster, else KUBECONFIG (~/.kube/config).

    KUBECONFIG is read when called (a `:`-separated list is merged, as kubectl does), and the
    file is never written back to. urllib3's own retries are switched off: a retried read
    timeout would multiply every wait, and the callers already retry on their own schedule.
    """
    if configuration is None:
        environ = os.environ if environ is None else environ
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException as in_cluster:
            kubeconfig = environ.get("KUBECONFIG") or None
            try:
                config.load_kube_config(
                    config_file=kubeconfig,
                    client_configuration=configuration,
                    persist_config=False,
                )
            except (config.ConfigException, OSError, ValueError) as problem:
                raise KubernetesConfigError(
                    f"no in-cluster configuration ({in_cluster}) and no usable kubeconfig "
                    f"({kubeconfig or '~/.kube/config'}: {problem})"
                ) from None
    configuration.retries = False
    return client.ApiClient(configuration)


def list_pods(
    api: client.ApiClient,
    *,
    namespace: str,
    label_selector: str,
    timeout: Timeout = DEFAULT_TIMEOUT,
    page_size: int = LIST_PAGE,
) -> PodListing:
    """Every pod of `namespace` matching `label_selector`, paged, as one consistent snapshot.

    Reads the raw JSON rather than building models: only three fields per pod are needed.
    """
    core = client.CoreV1Api(api)
    pods: list[PodObservation] = []
    token: str | None = None
    resource_version = ""
    while True:
        body = _call_json(
            core.list_namespaced_pod,
            namespace,
            label_selector=label_selector or None,
            limit=page_size,
            _continue=token,
            _request_timeout=timeout,
        )
        items = body.get("items") or []
        pods.extend(_observation(item) for item in items)
        meta = body.get("metadata") or {}
        resource_version = resource_version or str(meta.get("resourceVersion") or "")
        token = meta.get("continue") or None
        if token is None:
            break
    if not resource_version:
        raise KubernetesUnavailable("pod list carried no metadata.resourceVersion")
    return PodListing(resource_version, tuple(pods))


def read_pod(
    api: client.ApiClient, *, namespace: str, name: str, timeout: Timeout = DEFAULT_TIMEOUT
) -> PodObservation | None:
    """GET one pod by name: its observation, or None when the API answers 404 (no such pod).

    Any other failure raises KubernetesUnavailable: only a 404 says the pod is absent.
    """
    core = client.CoreV1Api(api)
    body = _read_json(core.read_namespaced_pod, name, namespace, timeout)
    return None if body is None else _observation(body)


def watch_pods(
    api: client.ApiClient,
    *,
    namespace: str,
    label_selector: str,
    resource_version: str,
    watcher: watch.Watch,
    timeout_seconds: int,
    timeout: Timeout,
) -> Iterator[PodEvent]:
    """Watch events after `resource_version`, with bookmarks, until the server ends the watch.

    `timeout_seconds` is the server-side duration of the watch; `timeout` bounds the connect and
    each read, so a silent dead connection ends too. `watcher.stop()` from another thread ends
    the iteration promptly. A 410 (as an HTTP status or an ERROR event) raises ResourceExpired.
    """
    core = client.CoreV1Api(api)
    try:
        stream = watcher.stream(
            core.list_namespaced_pod,
            namespace,
            label_selector=label_selector or None,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_seconds,
            _request_timeout=timeout,
        )
        for raw in stream:
            kind = str(raw.get("type", ""))
            obj = raw.get("raw_object") or {}
            version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            if kind == "BOOKMARK":
                yield PodEvent(kind, version, None)
            elif kind in ("ADDED", "MODIFIED", "DELETED"):
                yield PodEvent(kind, version, _observation(obj))
            else:
                logger.debug("Ignored pod watch event of type %r", kind)
    except ApiException as exc:
        raise _unavailable(exc) from exc
    except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError, TypeError) as exc:
        raise KubernetesUnavailable(f"pod watch broke: {type(exc).__name__}: {exc}") from exc


def read_lease(
    api: client.ApiClient, *, namespace: str, name: str, timeout: Timeout = DEFAULT_TIMEOUT
) -> LeaseRecord | None:
    """The Lease, or None when it does not exist (404)."""
    coordination = client.CoordinationV1Api(api)
    body = _read_json(coordination.read_namespaced_lease, name, namespace, timeout)
    return None if body is None else _lease_record(body)


def create_lease(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    holder: str,
    duration_s: int,
    now: datetime,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> LeaseRecord:
    """Create the Lease held by `holder`. Raises Conflict (409) when it exists already."""
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=duration_s,
            acquire_time=micro_time(now),
            renew_time=micro_time(now),
            lease_transitions=0,
        ),
    )
    coordination = client.CoordinationV1Api(api)
    body = _call_json(
        coordination.create_namespaced_lease, namespace, lease, _request_timeout=timeout
    )
    return _lease_record(body)


def replace_lease(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    resource_version: str,
    holder: str | None,
    duration_s: int,
    acquire_time: datetime | None,
    renew_time: datetime,
    transitions: int,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> LeaseRecord:
    """Update the Lease read at `resource_version`. Raises Conflict (409) if it changed since."""
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(
            name=name, namespace=namespace, resource_version=resource_version
        ),
        spec=client.V1LeaseSpec(
            holder_identity=holder,
            lease_duration_seconds=duration_s,
            acquire_time=micro_time(acquire_time) if acquire_time else None,
            renew_time=micro_time(renew_time),
            lease_transitions=transitions,
        ),
    )
    coordination = client.CoordinationV1Api(api)
    body = _call_json(
        coordination.replace_namespaced_lease, name, namespace, lease, _request_timeout=timeout
    )
    return _lease_record(body)


def micro_time(moment: datetime) -> datetime:
    """`moment` in UTC, never on a whole second.

    The client writes datetimes with `isoformat()`, which drops the fraction when microsecond
    is 0, and the API server's MicroTime accepts only exactly six fractional digits: one
    renewal in a million would be refused with a 400. One microsecond later is harmless.
    """
    moment = moment.astimezone(UTC)
    return moment if moment.microsecond else moment.replace(microsecond=1)


def _call_json(method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a client method without model decoding; return the JSON body as a dict."""
    try:
        response = method(*args, _preload_content=False, **kwargs)
        try:
            data = response.data
        finally:
            response.release_conn()
        body = json.loads(data)
    except ApiException as exc:
        raise _unavailable(exc) from exc
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise KubernetesUnavailable(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(body, dict):
        raise KubernetesUnavailable(f"expected a JSON object, got {type(body).__name__}")
    return body


def _read_json(method: Any, name: str, namespace: str, timeout: Timeout) -> dict[str, Any] | None:
    """GET one object by name as JSON; None when the API answers 404 (no such object)."""
    try:
        return _call_json(method, name, namespace, _request_timeout=timeout)
    except KubernetesUnavailable as exc:
        if exc.status == HTTP_NOT_FOUND:
            return None
        raise


def _unavailable(exc: ApiException) -> Exception:
    status = exc.status if isinstance(exc.status, int) else None
    message = status_message(exc)
    if status == HTTP_CONFLICT:
        return Conflict(message)
    if status == HTTP_GONE:
        return ResourceExpired(message, status=status)
    return KubernetesUnavailable(message, status=status)


def status_message(exc: ApiException) -> str:
    """`403 Forbidden: pods is forbidden: ...` from the Status body when there is one."""
    detail = exc.reason or ""
    try:
        status = json.loads(exc.body) if exc.body else {}
        if isinstance(status, dict) and status.get("message"):
            detail = f"{status.get('reason') or exc.reason}: {status['message']}"
    except ValueError:
        pass
    return f"{exc.status} {detail}".strip()


def _observation(item: Mapping[str, Any]) -> PodObservation:
    meta = item.get("metadata") or {}
    status = item.get("status") or {}
    return PodObservation(
        name=PodName(str(meta["name"])),
        phase=str(status.get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _lease_record(body: Mapping[str, Any]) -> LeaseRecord:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return LeaseRecord(
        name=str(meta.get("name") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        holder=spec.get("holderIdentity") or None,
        duration_s=int(duration) if duration is not None else None,
        acquire_time=_parse_time(spec.get("acquireTime")),
        renew_time=_parse_time(spec.get("renewTime")),
        transitions=int(spec.get("leaseTransitions") or 0),
    )


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
