"""The image's pruned Kubernetes client (scripts/prune_image.py) still does all the conductor
asks of it: the pod, Lease and TokenReview APIs, and every model a pod list, a pod, a Lease or a
TokenReview can carry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import kubernetes

REPO = Path(__file__).resolve().parents[2]

POD = {
    "metadata": {
        "name": "p",
        "namespace": "n",
        "labels": {"a": "b"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}],
    },
    "spec": {
        "containers": [
            {
                "name": "c",
                "image": "i",
                "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                "resources": {"limits": {"cpu": "1"}},
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}},
                "volumeMounts": [{"name": "v", "mountPath": "/x"}],
            }
        ],
        "volumes": [{"name": "v", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}],
        "affinity": {"nodeAffinity": {}},
        "tolerations": [{"key": "k", "operator": "Exists"}],
    },
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "c",
                "ready": True,
                "restartCount": 0,
                "image": "i",
                "imageID": "x",
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}},
            }
        ],
    },
}
REVIEW = {
    "kind": "TokenReview",
    "apiVersion": "authentication.k8s.io/v1",
    "metadata": {"creationTimestamp": None},
    "spec": {"token": "t", "audiences": ["rig-conductor"]},
    "status": {
        "authenticated": True,
        "audiences": ["rig-conductor"],
        "user": {
            "username": "system:serviceaccount:n:sa",
            "uid": "u",
            "groups": ["system:serviceaccounts"],
            "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
        },
    },
}
LEASE = {
    "metadata": {"name": "l"},
    "spec": {
        "holderIdentity": "me",
        "leaseDurationSeconds": 15,
        "renewTime": "2024-01-01T00:00:00.000000Z",
    },
}
CHECK = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kubernetes
from kubernetes import client, config, watch
assert kubernetes.__file__.startswith(sys.argv[1]), kubernetes.__file__
import rig_conductor.adapters.kubernetes, rig_conductor.reaper.leader, rig_conductor.reaper.podwatch
from rig_conductor.adapters import token_review
api = client.ApiClient()
client.CoreV1Api(api), client.CoordinationV1Api(api), client.AuthenticationV1Api(api)
pods, lease, review = sys.argv[2], sys.argv[3], sys.argv[4]
asked = client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t", audiences=["a"]))
assert api.sanitize_for_serialization(asked)["spec"]["audiences"] == ["a"]
review = api.deserialize(review, "V1TokenReview", "application/json")
identity = token_review.identity_of(review.status, audience="rig-conductor", namespace="n")
assert (identity.pod, identity.service_account) == ("p", "sa")
pods = api.deserialize(pods, "V1PodList", "application/json")
assert pods.items[0].spec.containers[0].readiness_probe.http_get.path == "/readyz"
assert api.deserialize(lease, "V1Lease", "application/json").spec.holder_identity == "me"
print("ok")
"""


def test_the_pruned_client_serves_the_conductor(tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(Path(kubernetes.__file__).parent, site / "kubernetes")
    pruned = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "prune_image.py"), str(site)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    assert not (site / "kubernetes" / "aio").exists()
    apis = {p.stem for p in (site / "kubernetes" / "client" / "api").glob("*.py")}
    assert apis == {"__init__", "core_v1_api", "coordination_v1_api", "authentication_v1_api"}
    done = subprocess.run(
        [
            sys.executable, "-c", CHECK, str(site),
            json.dumps({"metadata": {}, "items": [POD]}), json.dumps(LEASE), json.dumps(REVIEW),
        ],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
