"""The Helm chart and the Dockerfile, checked with the real tools: helm lint --strict,
kubernetes-validate --strict, the rendered environment, security and Secret wiring, hadolint
and checkov."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from rig_conductor import __version__
from tests import needs
from tests.chart import chartcheck
from tests.chart.conftest import (
    ALL_FEATURES,
    FULLNAME,
    KUBE_VERSIONS,
    NAMESPACE,
    REPO,
    TESTDATA,
    Render,
    Tools,
    helm_lint,
)

VALUES = {
    "defaults": (),
    "all-features": ("-f", ALL_FEATURES),
    "chart-secret": ("-f", TESTDATA / "chart-secret-values.yaml"),
    "audit": ("-f", TESTDATA / "audit-values.yaml"),
}


@pytest.mark.parametrize("values", list(VALUES))
def test_helm_lint_strict_passes(tools: Tools, values: str) -> None:
    done = helm_lint(tools, *VALUES[values])
    assert done.returncode == 0, done.stdout + done.stderr


def test_helm_lint_rejects_wrong_types(tools: Tools) -> None:
    done = helm_lint(tools, "-f", TESTDATA / "bad-values.yaml")
    out = done.stdout + done.stderr
    assert done.returncode != 0, "the schema must reject tests/chart/bad-values.yaml"
    assert "replicaCount" in out and "entryStaleMs" in out, out  # for the schema's reasons
    assert "sessionSecret" in out, out


@pytest.mark.parametrize(
    ("values", "crds"),
    [
        ("defaults", ""),
        ("all-features", "PrometheusRule,ServiceMonitor"),
        ("chart-secret", ""),
        ("audit", ""),
    ],
)
def test_kubernetes_validate_strict(
    tools: Tools, render: Render, tmp_path: Path, values: str, crds: str
) -> None:
    rendered = render(*VALUES[values])
    core, crd = tmp_path / "core.yaml", tmp_path / "crd.yaml"
    chartcheck.run(chartcheck.cmd_split, str(rendered), str(core), str(crd), crds)
    versions = [arg for v in KUBE_VERSIONS for arg in ("-k", v)]
    done = subprocess.run(
        [str(tools.kubernetes_validate), "--strict", "--quiet", *versions, str(core)],
        capture_output=True,
        text=True,
        check=False,
    )
    # kubernetes-validate only warns about a kind it has no schema for: every core kind must
    # have one, so any output is a failure.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout
    if crds:
        chartcheck.run(chartcheck.cmd_crds, str(crd), str(TESTDATA / "crd-schemas.json"))


def test_values_reach_their_rig_variables(render: Render) -> None:
    rendered = render("-f", TESTDATA / "env-values.yaml", "--set", "config.entryStaleMs=1234")
    chartcheck.run(
        chartcheck.cmd_env,
        str(rendered),
        json.dumps(
            {
                "RIG_HTTP_HOST": "::", "RIG_HTTP_PORT": "9091",
                "RIG_DISPATCH_STREAM": "env:dispatch",
                "RIG_STREAMS": "env:a,env:b*", "RIG_AGENT_IDS": "agent-a,agent-b",
                "RIG_ENTRY_STALE_MS": "1234", "RIG_AGENT_DOWN_MS": "86400000",
                "RIG_SCAN_INTERVAL_S": "2.5", "RIG_STARTUP_DELAY_S": "0", "RIG_MAX_DELIVERIES": "7",
                "RIG_ENTRY_DEADLINE_MS": "0", "RIG_RECLAIM_DEGRADED": "false",
                "RIG_DEGRADED_GRACE_MS": "4321", "RIG_AGENT_FORGET_MS": "172800000",
                "RIG_REDIS_MODE": "sentinel", "RIG_MAX_CONSUMERS_PER_AGENT": "77",
                "RIG_REDIS_SENTINELS": "s-0:26379,s-1:26379",
                "RIG_REDIS_SENTINEL_MASTER": "rig-master", "RIG_REDIS_WAIT_REPLICAS": "1",
                "RIG_DRY_RUN": "true", "RIG_K8S_ENABLED": "false", "RIG_K8S_NAMESPACE": "agents-ns",
                "RIG_K8S_LABEL_SELECTOR": "role=agent", "RIG_LOG_FORMAT": "text",
                "RIG_TENANT": "tenant-x", "RIG_EVENT_RETENTION_DAYS": "45",
                "RIG_HTTP_ROOT_PATH": "/rig", "RIG_ALLOW_ANONYMOUS": "true",
                "RIG_FORWARDED_ALLOW_IPS": "10.0.0.0/8,192.168.1.1",
            }
        ),
    )  # fmt: skip
    chartcheck.run(
        chartcheck.cmd_env,
        str(render(name="defaults")),
        json.dumps(
            {
                "RIG_HTTP_PORT": "8080", "RIG_ENTRY_STALE_MS": "300000",
                "RIG_AGENT_DOWN_MS": "600000", "RIG_ENTRY_DEADLINE_MS": "3600000",
                "RIG_RECLAIM_DEGRADED": "true", "RIG_DEGRADED_GRACE_MS": "300000",
                "RIG_MAX_CONSUMERS_PER_AGENT": "1000",
                "RIG_AGENT_FORGET_MS": "604800000",
                "RIG_REDIS_MODE": "standalone", "RIG_REDIS_SENTINELS": "",
                "RIG_REDIS_SENTINEL_MASTER": "mymaster", "RIG_REDIS_WAIT_REPLICAS": "0",
                "RIG_K8S_NAMESPACE": NAMESPACE, "RIG_EVENT_RETENTION_DAYS": "30",
                "RIG_STREAMS": "rig:dispatch,assignments:*", "RIG_DRY_RUN": "false",
                "RIG_HTTP_ROOT_PATH": "", "RIG_ALLOW_ANONYMOUS": "false",
                "RIG_FORWARDED_ALLOW_IPS": "", "RIG_K8S_AGENT_AUTH": "false",
                "RIG_K8S_TOKEN_AUDIENCE": "rig-conductor",
            }
        ),
    )  # fmt: skip


def test_security_context_probes_hooks_and_rbac(render: Render) -> None:
    chartcheck.run(chartcheck.cmd_policy, str(render()))


def test_secrets_are_wired_from_an_existing_or_the_chart_secret(render: Render) -> None:
    chartcheck.run(chartcheck.cmd_secrets, str(render("-f", ALL_FEATURES)), "existing")
    secret = render("-f", TESTDATA / "chart-secret-values.yaml", name="chart-secret")
    chartcheck.run(chartcheck.cmd_secrets, str(secret), "chart")


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.audit"])
def test_hadolint_finds_nothing_in_the_dockerfile(tools: Tools, dockerfile: str) -> None:
    done = subprocess.run(
        [str(tools.hadolint), "--no-color", dockerfile],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_checkov_finds_nothing_but_the_skips_the_chart_explains(
    tools: Tools, render: Render
) -> None:
    """Every checkov finding is fixed, or skipped on its object with the reason
    (rig-conductor.checkovSkips, the Dockerfile's checkov:skip comment). Nothing is downloaded."""
    files = [render(*args, name=name) for name, args in VALUES.items()]
    chart = [str(tools.checkov), "--framework", "kubernetes", "--skip-download", "--compact"]
    done = subprocess.run(
        [*chart, "--quiet", *[arg for f in files for arg in ("-f", str(f))]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    dockerfile = [str(tools.checkov), "--framework", "dockerfile", "--skip-download", "--quiet"]
    for name in ("Dockerfile", "Dockerfile.audit"):
        done = subprocess.run(
            [*dockerfile, "-f", name], capture_output=True, text=True, check=False, cwd=REPO
        )
        assert done.returncode == 0, name + ": " + done.stdout[-4000:]
    for doc in yaml.safe_load_all(files[0].read_text()):
        for key, value in ((doc or {}).get("metadata", {}).get("annotations") or {}).items():
            if key.startswith("checkov.io/skip"):
                check_id, _, reason = value.partition("=")
                assert check_id.startswith("CKV") and len(reason.strip()) >= 20, (key, value)


def test_the_container_spec_asks_for_what_the_image_smoke_test_runs(render: Render) -> None:
    """The Deployment runs the image tests/image builds and smoke-tests, the way it ran there:
    its user, a read-only root, no capabilities, the probes on the endpoints it answered."""
    from tests.image import hardening

    rendered = render(
        "--set", f"image.repository={hardening.IMAGE_REPOSITORY}",
        "--set", f"image.tag={hardening.IMAGE_TAG}",
    )  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == hardening.IMAGE
    security = container["securityContext"]
    assert (security["runAsUser"], security["runAsGroup"]) == (hardening.USER, hardening.GROUP)
    assert pod["securityContext"]["runAsUser"] == hardening.USER
    assert security["readOnlyRootFilesystem"] is True  # --read-only
    assert security["capabilities"]["drop"] == ["ALL"]  # --cap-drop=all
    assert security["allowPrivilegeEscalation"] is False and security["runAsNonRoot"] is True
    assert container["ports"][0]["containerPort"] == hardening.HTTP_PORT
    assert container["livenessProbe"]["httpGet"]["path"] == hardening.LIVENESS_PATH
    assert container["readinessProbe"]["httpGet"]["path"] == hardening.READINESS_PATH
    resources = container["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # the only place the process writes, as in the smoke test


def test_the_built_image_is_configured_as_the_chart_runs_it() -> None:
    """With the image built (make test-image runs first in .ci/run): its user and port are the
    ones the chart's container spec assumes."""
    import os
    import shutil

    from tests.image import hardening

    if shutil.which("podman") is None:
        needs.missing("no podman: the image is built and inspected where .ci/run runs")
    cache = os.environ.get("RIG_IMAGE_CACHE", "/var/cache/rig-conductor")
    env = {**os.environ, "CONTAINERS_CONF": f"{cache}/containers.conf"}
    found = subprocess.run(
        ["podman", "image", "inspect", hardening.IMAGE], capture_output=True, text=True, env=env
    )
    if found.returncode != 0:
        needs.missing(f"{hardening.IMAGE} is not built here (make test-image builds it first)")
    config = json.loads(found.stdout)[0]["Config"]
    assert config["User"] in (str(hardening.USER), f"{hardening.USER}:{hardening.GROUP}")
    assert f"{hardening.HTTP_PORT}/tcp" in config.get("ExposedPorts", {})


def test_the_audit_cron_job_runs_the_audit_hardened_into_its_volume(render: Render) -> None:
    assert not [
        d
        for d in yaml.safe_load_all(render(name="off").read_text())
        if d and d["kind"] == "CronJob"
    ], "no CronJob unless audit.enabled"
    docs = [d for d in yaml.safe_load_all(render(*VALUES["audit"]).read_text()) if d]
    (cron,) = [d for d in docs if d["kind"] == "CronJob"]
    assert cron["spec"]["schedule"] == "*/30 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"rig-conductor:{__version__}-audit"
    assert container["args"] == [
        "audit", "--output", "/var/lib/rig-audit/latest",
        "--master", "spark://spark-master:7077", "--partitions", "8",
    ]  # fmt: skip
    env = {e["name"]: e for e in container["env"]}
    assert env["HOME"]["value"] == "/tmp" and env["RIG_TENANT"]["value"] == "default"
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["capabilities"]["drop"] == [
        "ALL"
    ]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "output": "/var/lib/rig-audit"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["output"]["persistentVolumeClaim"]["claimName"] == "rig-audit-output"
    assert (
        container["resources"]["requests"]["memory"] and container["resources"]["limits"]["memory"]
    )


def test_the_ingress_serves_api_and_console_under_the_root_path(render: Render) -> None:
    docs = chartcheck.load(str(render("-f", ALL_FEATURES)))
    [ingress] = chartcheck.find(docs, "Ingress")
    [service] = chartcheck.find(docs, "Service")
    rule = ingress["spec"]["rules"][0]
    [path] = rule["http"]["paths"]
    assert (rule["host"], path["path"], path["pathType"]) == ("rig.example.com", "/rig", "Prefix")
    assert path["backend"]["service"] == {
        "name": service["metadata"]["name"],
        "port": {"name": "http"},
    }
    assert ingress["spec"]["tls"] == [{"secretName": "rig-tls", "hosts": ["rig.example.com"]}]
    assert not chartcheck.find(chartcheck.load(str(render(name="no-ingress"))), "Ingress")


def test_agent_auth_sets_its_settings_and_binds_the_auth_delegator(render: Render) -> None:
    def conductor(docs: list[dict[str, Any]]) -> tuple[dict[str, str | None], dict[str, Any]]:
        [deployment] = chartcheck.find(docs, "Deployment")
        pod = deployment["spec"]["template"]["spec"]
        return {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}, pod

    off = chartcheck.load(str(render(name="off")))
    assert not chartcheck.find(off, "ClusterRoleBinding")
    assert not chartcheck.find(off, "ClusterRole")

    on = chartcheck.load(
        str(
            render(
                "--set", "agentAuth.enabled=true", "--set", "agentAuth.audience=rigs",
                "--set", "config.k8sEnabled=false", name="on",
            )
        )
    )  # fmt: skip
    [binding] = chartcheck.find(on, "ClusterRoleBinding")
    assert binding["metadata"]["name"] == f"{NAMESPACE}-{FULLNAME}-auth-delegator"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:auth-delegator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    assert not chartcheck.find(on, "ClusterRole")  # the built-in one, never a copy of ours
    env, pod = conductor(on)
    assert (env["RIG_K8S_AGENT_AUTH"], env["RIG_K8S_TOKEN_AUDIENCE"]) == ("true", "rigs")
    # No pod watch, but the TokenReviews need the conductor's own token.
    assert env["RIG_K8S_ENABLED"] == "false" and pod["automountServiceAccountToken"] is True
    _, watchless = conductor(chartcheck.load(str(render("--set", "config.k8sEnabled=false"))))
    assert watchless["automountServiceAccountToken"] is False

    no_rbac = render("--set", "agentAuth.enabled=true", "--set", "rbac.create=false", name="none")
    assert not chartcheck.find(chartcheck.load(str(no_rbac)), "ClusterRoleBinding")
