"""A stand-in for the slice of kube-apiserver the conductor uses, on 127.0.0.1 only.

Speaks the real wire format, so tests drive the official `kubernetes` client unchanged:
- GET  /api/v1/namespaces/{ns}/pods: a PodList with metadata.resourceVersion, labelSelector
  filtering (equality, inequality, existence, `in`/`notin`), limit/continue paging;
  with watch=true a chunked stream of newline-delimited watch events (ADDED, MODIFIED,
  DELETED, BOOKMARK when allowWatchBookmarks, ERROR with a Status of code 410 for an expired
  resourceVersion), ended after timeoutSeconds;
- GET  /api/v1/namespaces/{ns}/pods/{name}: the Pod, or a 404 NotFound Status;
- GET/PUT /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name} and POST .../leases:
  404 NotFound, 409 AlreadyExists, 409 Conflict on a stale resourceVersion, 400 on a MicroTime
  the real server would refuse.
- POST /apis/authentication.k8s.io/v1/tokenreviews: the TokenReview answer for the tokens in
  `tokens` (standin_tokens.py).
Faults are injected per request kind: an error Status (403, 500, ...), a delay, or a Lease
stolen by another holder just before an update is applied.

Test-only code: one lock guards all state; every watch connection runs in its own thread.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .standin_tokens import TokenTable

PODS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods$")
POD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)$")
LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases$")
LEASE = re.compile(
    r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/leases/(?P<name>[^/]+)$"
)
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
MICRO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, message: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, HTTPStatus(code).phrase.replace(" ", "")),
        "code": code,
    }


@dataclass
class Fault:
    """What to do to the next `times` requests of one kind (None: every request)."""

    # pods-list, pods-watch, pod-get, lease-get, lease-create, lease-update, token-review
    kind: str
    status: int | None = None
    delay: float = 0.0
    steal_by: str | None = None  # lease-update: another holder writes the Lease first
    times: int | None = 1


@dataclass
class _Watcher:
    namespace: str
    selector: str
    bookmarks: bool
    position: int
    connection: socket.socket
    dropped: bool = False
    expired: bool = False


@dataclass
class _Event:
    rv: int
    type: str
    namespace: str
    obj: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)


class KubeStandIn:
    """The stand-in server. Use as a context manager; `url` is its base URL."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 1000
        self.compacted = 0  # a watch from a resourceVersion below this is 410 Gone
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.history: list[_Event] = []
        self.watchers: list[_Watcher] = []
        self.faults: list[Fault] = []
        self.tokens = TokenTable()
        # Every request by kind, with the perf_counter() it arrived at.
        self.requests: list[tuple[str, float]] = []
        self.closing = False
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> KubeStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # --- pods, driven by the test ----------------------------------------------------------

    def add_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        labels: dict[str, str] | None = None,
        phase: str = "Running",
    ) -> None:
        with self.cond:
            pod = {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": str(uuid.uuid4()),
                    "creationTimestamp": timestamp(),
                    "labels": dict(labels or {}),
                },
                "spec": {"containers": [{"name": "agent", "image": "rig-agent:test"}]},
                "status": {"phase": phase},
            }
            self.pods[(namespace, name)] = pod
            self._emit("ADDED", namespace, pod)

    def set_phase(self, name: str, phase: str, *, namespace: str = "default") -> None:
        with self.cond:
            pod = self.pods[(namespace, name)]
            pod["status"]["phase"] = phase
            self._emit("MODIFIED", namespace, pod)

    def terminate(self, name: str, *, namespace: str = "default") -> None:
        """`kubectl delete` with a grace period: deletionTimestamp set, the pod still there."""
        with self.cond:
            pod = self.pods[(namespace, name)]
            pod["metadata"]["deletionTimestamp"] = timestamp()
            pod["metadata"]["deletionGracePeriodSeconds"] = 30
            self._emit("MODIFIED", namespace, pod)

    def delete(self, name: str, *, namespace: str = "default") -> None:
        with self.cond:
            pod = self.pods.pop((namespace, name))
            self._emit("DELETED", namespace, pod)

    def bookmark(self) -> None:
        """A BOOKMARK at the current resourceVersion to every watch that allows them."""
        with self.cond:
            self.history.append(_Event(self.rv, "BOOKMARK", "", {}))
            self.cond.notify_all()

    def expire_watches(self) -> None:
        """etcd compaction: open watches get ERROR 410 and resuming from their version fails."""
        with self.cond:
            self.rv += 1
            self.compacted = self.rv
            for watcher in self.watchers:
                watcher.expired = True
            self.cond.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch connection without ending the chunked stream."""
        with self.cond:
            for watcher in self.watchers:
                watcher.dropped = True
                with contextlib.suppress(OSError):
                    watcher.connection.shutdown(socket.SHUT_RDWR)
            self.cond.notify_all()

    def open_watches(self) -> int:
        with self.cond:
            return len(self.watchers)

    def inject(self, fault: Fault) -> None:
        with self.cond:
            self.faults.append(fault)

    def clear_faults(self) -> None:
        with self.cond:
            self.faults.clear()

    def count(self, kind: str) -> int:
        return len(self.arrivals(kind))

    def arrivals(self, kind: str) -> list[float]:
        """The perf_counter() of each request of `kind`, in order."""
        with self.cond:
            return [at for k, at in self.requests if k == kind]

    def lease(self, name: str, *, namespace: str = "default") -> dict[str, Any] | None:
        with self.cond:
            return json.loads(json.dumps(self.leases.get((namespace, name))))

    def _emit(self, kind: str, namespace: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        snapshot = {"kind": "Pod", "apiVersion": "v1", **json.loads(json.dumps(obj))}
        labels = dict(obj["metadata"].get("labels") or {})
        self.history.append(_Event(self.rv, kind, namespace, snapshot, labels))
        self.cond.notify_all()

    def take_fault(self, kind: str) -> Fault | None:
        with self.cond:
            self.requests.append((kind, time.perf_counter()))
            for fault in self.faults:
                if fault.kind == kind:
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            self.faults.remove(fault)
                    return fault
        return None


# --- label selectors ------------------------------------------------------------------------

_SET_EXPR = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def matches(selector: str, labels: dict[str, str]) -> bool:
    return all(_satisfied(r, labels) for r in _split_selector(selector))


def _satisfied(requirement: str, labels: dict[str, str]) -> bool:
    found = _SET_EXPR.match(requirement)
    if found:
        key, op, values = found.groups()
        inside = labels.get(key) in {v.strip() for v in values.split(",")}
        return inside if op == "in" else not (key in labels and inside)
    if "!=" in requirement:
        key, value = (part.strip() for part in requirement.split("!=", 1))
        return labels.get(key) != value
    if "=" in requirement:
        key, value = (part.strip() for part in requirement.replace("==", "=").split("=", 1))
        return labels.get(key) == value
    if requirement.startswith("!"):
        return requirement[1:].strip() not in labels
    return requirement in labels


# --- HTTP -----------------------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: KubeStandIn) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.api = api


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    @property
    def api(self) -> KubeStandIn:
        return self.server.api

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _route(self, method: str) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        try:
            if method == "GET" and self._route_pods(parts.path, query):
                return
            if (found := LEASE.match(parts.path)) and method in ("GET", "PUT"):
                kind = "lease-get" if method == "GET" else "lease-update"
                answered, fault = self._fault(kind)
                if answered:
                    return
                if method == "GET":
                    self._get_lease(found["ns"], found["name"])
                else:
                    steal = fault.steal_by if fault is not None else None
                    self._put_lease(found["ns"], found["name"], steal)
            elif parts.path == TOKEN_REVIEWS and method == "POST":
                if not self._fault("token-review")[0]:
                    self._send(201, self.api.tokens.review(self._read_body() or {}))
            elif (found := LEASES.match(parts.path)) and method == "POST":
                if self._fault("lease-create")[0]:
                    return
                self._create_lease(found["ns"])
            else:
                self._send(404, status_body(404, f"the server could not find {parts.path}"))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _route_pods(self, path: str, query: dict[str, str]) -> bool:
        """GET on the pods collection (list or watch) or on one pod; False for other paths."""
        if found := PODS.match(path):
            watching = query.get("watch", "").lower() in ("true", "1")
            if not self._fault("pods-watch" if watching else "pods-list")[0]:
                if watching:
                    self._watch(found["ns"], query)
                else:
                    self._list(found["ns"], query)
            return True
        if found := POD.match(path):
            if not self._fault("pod-get")[0]:
                self._get_pod(found["ns"], found["name"])
            return True
        return False

    def _fault(self, kind: str) -> tuple[bool, Fault | None]:
        """Apply an injected fault; (True, _) when it answered the request already."""
        fault = self.api.take_fault(kind)
        if fault is None:
            return False, None
        if fault.delay:
            time.sleep(fault.delay)  # a slow API server, as the test injected it
        if fault.status is not None:
            self._read_body()
            self._send(fault.status, status_body(fault.status, f"injected {fault.status}"))
            return True, fault
        return False, fault

    def _read_body(self) -> dict[str, Any] | None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    # pods

    def _list(self, namespace: str, query: dict[str, str]) -> None:
        selector = query.get("labelSelector", "")
        limit = int(query.get("limit") or 0)
        start = int(query.get("continue") or 0)
        with self.api.cond:
            items = [
                json.loads(json.dumps(pod))
                for (ns, _), pod in sorted(self.api.pods.items())
                if ns == namespace and matches(selector, pod["metadata"].get("labels") or {})
            ]
            version = str(self.api.rv)
        meta: dict[str, Any] = {"resourceVersion": version}
        if limit:
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            items = items[start : start + limit]
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})

    def _watch(self, namespace: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + int(query.get("timeoutSeconds") or 1800)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        with self.api.cond:
            if since and since < self.api.compacted:
                self._chunk(_expired(since, self.api.compacted))
                self._end()
                return
            position = next(
                (i for i, e in enumerate(self.api.history) if e.rv > since), len(self.api.history)
            )
            watcher = _Watcher(
                namespace,
                query.get("labelSelector", ""),
                query.get("allowWatchBookmarks", "").lower() in ("true", "1"),
                position,
                self.connection,
            )
            self.api.watchers.append(watcher)
        try:
            self._stream(watcher, deadline)
        finally:
            with self.api.cond:
                self.api.watchers.remove(watcher)

    def _stream(self, watcher: _Watcher, deadline: float) -> None:
        while True:
            with self.api.cond:
                while (
                    watcher.position >= len(self.api.history)
                    and not (watcher.dropped or watcher.expired or self.api.closing)
                    and time.monotonic() < deadline
                ):
                    self.api.cond.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                if watcher.dropped or self.api.closing:
                    return  # the socket is cut: no terminating chunk
                if watcher.expired:
                    self._chunk(_expired(self.api.compacted - 1, self.api.compacted))
                    self._end()
                    return
                if time.monotonic() >= deadline:
                    self._end()
                    return
                pending = self.api.history[watcher.position :]
                watcher.position = len(self.api.history)
            for event in pending:
                self._deliver(watcher, event)

    def _deliver(self, watcher: _Watcher, event: _Event) -> None:
        if event.type == "BOOKMARK":
            if watcher.bookmarks:
                meta = {"resourceVersion": str(event.rv)}
                self._chunk(
                    {
                        "type": "BOOKMARK",
                        "object": {"kind": "Pod", "apiVersion": "v1", "metadata": meta},
                    }
                )
            return
        if event.namespace != watcher.namespace or not matches(watcher.selector, event.labels):
            return
        self._chunk({"type": event.type, "object": event.obj})

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # leases

    def _get_pod(self, namespace: str, name: str) -> None:
        with self.api.cond:
            found = self.api.pods.get((namespace, name))
            pod = json.loads(json.dumps(found)) if found is not None else None
        if pod is None:
            self._send(404, status_body(404, f'pods "{name}" not found', "NotFound"))
        else:
            self._send(200, pod)

    def _get_lease(self, namespace: str, name: str) -> None:
        with self.api.cond:
            lease = self.api.leases.get((namespace, name))
            body = json.loads(json.dumps(lease)) if lease else None
        if body is None:
            message = f'leases.coordination.k8s.io "{name}" not found'
            self._send(404, status_body(404, message))
        else:
            self._send(200, body)

    def _create_lease(self, namespace: str) -> None:
        body = self._read_body() or {}
        name = (body.get("metadata") or {}).get("name", "")
        if (problem := _invalid_lease(body)) is not None:
            self._send(400, status_body(400, problem))
            return
        with self.api.cond:
            if (namespace, name) in self.api.leases:
                message = f'leases.coordination.k8s.io "{name}" already exists'
                self._send(409, status_body(409, message, "AlreadyExists"))
                return
            self.api.rv += 1
            body["metadata"].update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                resourceVersion=str(self.api.rv),
                creationTimestamp=timestamp(),
            )
            lease = {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **body}
            self.api.leases[(namespace, name)] = lease
            answer = json.loads(json.dumps(lease))
        self._send(201, answer)

    def _put_lease(self, namespace: str, name: str, steal_by: str | None) -> None:
        body = self._read_body() or {}
        if (problem := _invalid_lease(body)) is not None:
            self._send(400, status_body(400, problem))
            return
        with self.api.cond:
            current = self.api.leases.get((namespace, name))
            if current is None:
                self._send(404, status_body(404, f'leases.coordination.k8s.io "{name}" not found'))
                return
            if steal_by is not None:
                self.api.rv += 1
                now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                current["spec"].update(holderIdentity=steal_by, renewTime=now, acquireTime=now)
                current["metadata"]["resourceVersion"] = str(self.api.rv)
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                message = (
                    f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": '
                    "the object has been modified; please apply your changes to the latest "
                    "version and try again"
                )
                self._send(409, status_body(409, message))
                return
            self.api.rv += 1
            current["spec"] = body.get("spec") or {}
            current["metadata"]["resourceVersion"] = str(self.api.rv)
            answer = json.loads(json.dumps(current))
        self._send(200, answer)


def _expired(since: int, oldest: int) -> dict[str, Any]:
    message = f"too old resource version: {since} ({oldest})"
    return {"type": "ERROR", "object": status_body(410, message, "Expired")}


def _invalid_lease(body: dict[str, Any]) -> str | None:
    """What the real API server would refuse with a 400, or None."""
    if not (body.get("metadata") or {}).get("name"):
        return "metadata.name: Required value"
    spec = body.get("spec") or {}
    for key in ("acquireTime", "renewTime"):
        value = spec.get(key)
        if value is not None and not MICRO_TIME.match(str(value)):
            return f'spec.{key}: parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00"'
    return None


@contextmanager
def running() -> Iterator[KubeStandIn]:
    with KubeStandIn() as api:
        yield api
