"""Fixtures for the Kubernetes tier: the API stand-in and a real client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from rig_conductor.adapters import kubernetes

from .standin import KubeStandIn


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    with KubeStandIn() as server:
        yield server


@pytest.fixture
def api(kube: KubeStandIn) -> Iterator[client.ApiClient]:
    """The official client, configured the way a kubeconfig would, against the stand-in."""
    api_client = kubernetes.api_client(configuration=client.Configuration(host=kube.url))
    yield api_client
    api_client.close()
