"""RIG_K8S_ENABLED and where the client's configuration comes from."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from rig_conductor.adapters import kubernetes
from rig_conductor.reaper import podwatch
from rig_conductor.settings import Settings

from .standin import KubeStandIn

IN_CLUSTER = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


@pytest.mark.parametrize(
    ("mode", "environ", "expected"),
    [
        ("true", {}, True),
        ("false", IN_CLUSTER, False),
        ("auto", IN_CLUSTER, True),
        ("auto", {}, False),
        ("auto", {"KUBERNETES_SERVICE_HOST": ""}, False),
    ],
)
def test_enabled(mode: str, environ: dict[str, str], expected: bool) -> None:
    assert kubernetes.enabled(mode, environ=environ) is expected


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster: {{server: "{server}"}}
users:
- name: conductor
  user: {{token: not-a-real-token}}
contexts:
- name: standin
  context: {{cluster: standin, user: conductor, namespace: agents}}
current-context: standin
"""
    )
    return path


async def test_kubeconfig_outside_a_cluster(
    kube: KubeStandIn, tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    config = kubeconfig(tmp_path / "config", kube.url)
    kube.add_pod("a-0", namespace="agents")
    settings = make_settings(k8s_enabled="true", k8s_namespace="agents")
    api = podwatch.api_client(settings, environ={"KUBECONFIG": str(config)})
    assert api is not None
    try:
        pods = podwatch.PodLiveness(api=api, namespace="agents", label_selector="")
        assert set((await pods.scan()).states) == {"a-0"}
    finally:
        api.close()
    assert config.read_text().count("not-a-real-token") == 1  # never written back


def test_forced_on_without_configuration_is_an_operator_error(
    tmp_path: Path, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(k8s_enabled="true")
    with pytest.raises(kubernetes.KubernetesConfigError, match="no usable kubeconfig"):
        podwatch.api_client(settings, environ={"KUBECONFIG": str(tmp_path / "missing")})


def test_auto_without_configuration_runs_without_pods(
    tmp_path: Path, make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(k8s_enabled="auto")
    environ = {**IN_CLUSTER, "KUBECONFIG": str(tmp_path / "missing")}
    with caplog.at_level(logging.WARNING):
        assert podwatch.api_client(settings, environ=environ) is None
    assert "Kubernetes configuration unusable" in caplog.text
    assert podwatch.api_client(make_settings(k8s_enabled="false"), environ=environ) is None
