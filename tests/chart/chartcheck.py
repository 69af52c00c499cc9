"""Checks on rendered chart output, driven by tests/chart/test_chart.py.

Each `cmd_*` takes file paths (the rendered chart, the rule file, ...) and records every problem
it finds with `check`; `run` calls one and fails with all of them at once.
"""

import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

# Every non-secret RIG_* variable the chart maps from values.
CONFIG_ENV = [
    "RIG_HTTP_HOST",
    "RIG_HTTP_PORT",
    "RIG_HTTP_ROOT_PATH",
    "RIG_ALLOW_ANONYMOUS",
    "RIG_FORWARDED_ALLOW_IPS",
    "RIG_DISPATCH_STREAM",
    "RIG_STREAMS",
    "RIG_AGENT_IDS",
    "RIG_ENTRY_STALE_MS",
    "RIG_AGENT_DOWN_MS",
    "RIG_SCAN_INTERVAL_S",
    "RIG_STARTUP_DELAY_S",
    "RIG_MAX_DELIVERIES",
    "RIG_DRY_RUN",
    "RIG_K8S_ENABLED",
    "RIG_K8S_NAMESPACE",
    "RIG_K8S_LABEL_SELECTOR",
    "RIG_K8S_AGENT_AUTH",
    "RIG_K8S_TOKEN_AUDIENCE",
    "RIG_LOG_FORMAT",
    "RIG_TENANT",
    "RIG_EVENT_RETENTION_DAYS",
    "RIG_ENTRY_DEADLINE_MS",
    "RIG_RECLAIM_DEGRADED",
    "RIG_DEGRADED_GRACE_MS",
    "RIG_MAX_CONSUMERS_PER_AGENT",
    "RIG_AGENT_FORGET_MS",
    "RIG_REDIS_MODE",
    "RIG_REDIS_SENTINELS",
    "RIG_REDIS_SENTINEL_MASTER",
    "RIG_REDIS_WAIT_REPLICAS",
]
SECRET_ENV = [
    "RIG_DATABASE_URL",
    "RIG_REDIS_URL",
    "RIG_API_TOKENS",
    "RIG_OPERATOR_TOKENS",
    "RIG_VIEWER_TOKENS",
    "RIG_AGENT_TOKENS",
    "RIG_REDIS_SENTINEL_PASSWORD",
    "RIG_SESSION_SECRET",
]
TLS_ENV = ["RIG_REDIS_TLS_CA_FILE", "RIG_REDIS_TLS_CERT_FILE", "RIG_REDIS_TLS_KEY_FILE"]

errors: list[str] = []


def check(cond: object, msg: str) -> None:
    if not cond:
        errors.append(msg)


def run(command: Any, *args: str) -> None:
    """Run one `cmd_*` check; fail with every problem it found."""
    errors.clear()
    command(*args)
    found = list(errors)
    errors.clear()
    assert not found, "\n".join(found)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def find(docs, kind, name_suffix=None):
    out = [d for d in docs if d["kind"] == kind]
    if name_suffix is not None:
        out = [d for d in out if d["metadata"]["name"].endswith(name_suffix)]
    return out


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def cmd_split(rendered, core_out, crd_out, expect_crds):
    """Split rendered output into core kinds and CRD kinds; check which CRD kinds appear."""
    docs = load(rendered)
    core = [d for d in docs if d["kind"] not in CRD_KINDS]
    crds = [d for d in docs if d["kind"] in CRD_KINDS]
    with open(core_out, "w") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    with open(crd_out, "w") as f:
        yaml.safe_dump_all(crds, f, sort_keys=False)
    want = set(expect_crds.split(",")) - {""}
    got = {d["kind"] for d in crds}
    check(got == want, f"CRD kinds rendered: {sorted(got)}, expected {sorted(want)}")
    print(f"{len(core)} core objects, {len(crds)} CRD objects ({', '.join(sorted(got)) or 'none'})")


def cmd_crds(crd_file, schema_file):
    """Validate ServiceMonitor / PrometheusRule against the strict subset schemas."""
    from tests.chart.monitoring_checks import check_query

    schemas = json.loads(Path(schema_file).read_text())
    for d in load(crd_file):
        v = jsonschema.Draft7Validator(schemas[d["kind"]])
        errs = sorted(v.iter_errors(d), key=lambda e: list(e.path))
        for e in errs:
            check(
                False,
                f"{d['kind']}/{d['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}",
            )
        if d["kind"] == "PrometheusRule":
            for g in d["spec"]["groups"]:
                for r in g["rules"]:
                    check_query(f"PrometheusRule alert {r.get('alert')}", r["expr"])
                    check(
                        "severity" in r.get("labels", {}),
                        f"alert {r.get('alert')}: no severity label",
                    )
        if not errs:
            print(f"OK {d['kind']}/{d['metadata']['name']}")


def cmd_env(rendered, expected_json):
    """The Deployment's env holds exactly CONFIG_ENV (+ secrets) with the expected values."""
    expected = json.loads(expected_json)
    docs = load(rendered)
    for kind, suffix in (("Deployment", None), ("Job", "-migrate")):
        objs = find(docs, kind, suffix)
        check(len(objs) == 1, f"expected one {kind}, found {len(objs)}")
        if not objs:
            continue
        c = objs[0]["spec"]["template"]["spec"]["containers"][0]
        env = env_of(c)
        names = [e["name"] for e in c.get("env", [])]
        check(len(names) == len(set(names)), f"{kind}: duplicate env names: {names}")
        rig = sorted(
            n for n in names if n.startswith("RIG_") and n not in SECRET_ENV and n not in TLS_ENV
        )
        check(rig == sorted(CONFIG_ENV), f"{kind}: RIG_* names {rig} != {sorted(CONFIG_ENV)}")
        for name, want in expected.items():
            got = env.get(name, {}).get("value")
            check(got == want, f"{kind}: {name}={got!r}, expected {want!r}")
        print(f"{kind}: {len(rig)} RIG_* settings checked")


def cmd_secrets(rendered, mode):
    """Secret wiring: mode 'existing' (all-features values) or 'chart' (chart-secret values)."""
    docs = load(rendered)
    dep = find(docs, "Deployment")[0]
    job = find(docs, "Job", "-migrate")[0]
    dep_env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
    job_env = env_of(job["spec"]["template"]["spec"]["containers"][0])
    secrets = {d["metadata"]["name"]: d for d in find(docs, "Secret")}
    if mode == "existing":
        check(not secrets, f"existingSecret set, yet the chart renders Secrets {sorted(secrets)}")
        want = {
            "RIG_DATABASE_URL": "database-url",
            "RIG_REDIS_URL": "redis-url",
            "RIG_API_TOKENS": "api-tokens",
            "RIG_OPERATOR_TOKENS": "operator-tokens",
            "RIG_VIEWER_TOKENS": "viewer-tokens",
            "RIG_AGENT_TOKENS": "agent-tokens",
            "RIG_REDIS_SENTINEL_PASSWORD": "redis-sentinel-password",
            "RIG_SESSION_SECRET": "session-secret",
        }
        for env in (dep_env, job_env):
            for name, key in want.items():
                ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
                check(
                    ref.get("name") == "rig-conductor-credentials" and ref.get("key") == key,
                    f"{name}: secretKeyRef {ref}",
                )
            tls = {name: env.get(name, {}).get("value") for name in TLS_ENV}
            check(
                tls
                == {
                    "RIG_REDIS_TLS_CA_FILE": "/etc/rig/redis-tls/ca.crt",
                    "RIG_REDIS_TLS_CERT_FILE": "/etc/rig/redis-tls/tls.crt",
                    "RIG_REDIS_TLS_KEY_FILE": "/etc/rig/redis-tls/tls.key",
                },
                f"TLS env {tls}",
            )
        for obj in (dep, job):
            spec = obj["spec"]["template"]["spec"]
            mounts = {m["name"]: m for m in spec["containers"][0].get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            check(
                mounts.get("redis-tls", {}).get("mountPath") == "/etc/rig/redis-tls"
                and mounts["redis-tls"].get("readOnly") is True,
                f"redis-tls mount {mounts}",
            )
            check(
                volumes.get("redis-tls", {}).get("secret", {}).get("secretName") == "redis-tls",
                f"redis-tls volume {volumes.get('redis-tls')}",
            )
    else:
        main = [
            n
            for n, s in secrets.items()
            if "helm.sh/hook" not in s["metadata"].get("annotations", {})
        ]
        hook = [
            n for n, s in secrets.items() if "helm.sh/hook" in s["metadata"].get("annotations", {})
        ]
        check(
            len(main) == 1 and len(hook) == 1,
            f"expected one release and one hook Secret: {sorted(secrets)}",
        )
        if main and hook:
            ann = secrets[hook[0]]["metadata"]["annotations"]
            check(ann["helm.sh/hook"] == "pre-install,pre-upgrade", f"hook Secret hooks: {ann}")
            check(
                int(ann["helm.sh/hook-weight"])
                < int(job["metadata"]["annotations"]["helm.sh/hook-weight"]),
                "hook Secret must be created before the migration Job",
            )
            check(
                secrets[main[0]]["data"] == secrets[hook[0]]["data"],
                "release and hook Secret data differ",
            )
            for env, sname in ((dep_env, main[0]), (job_env, hook[0])):
                for name in SECRET_ENV:
                    ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
                    check(
                        ref.get("name") == sname and ref.get("key") == name,
                        f"{name}: secretKeyRef {ref}",
                    )
            check(
                "checksum/secret" in dep["spec"]["template"]["metadata"].get("annotations", {}),
                "Deployment has no checksum/secret annotation",
            )
    print(f"secret wiring ({mode}) checked")


def _check_security(kind, name, pod_spec, uid):
    psc = pod_spec.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"{kind}/{name}: pod runAsNonRoot")
    check(
        psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
        f"{kind}/{name}: pod seccompProfile",
    )
    for c in pod_spec["containers"]:
        sc = c.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True, f"{kind}/{name}/{c['name']}: runAsNonRoot")
        check(
            sc.get("runAsUser") == uid,
            f"{kind}/{name}/{c['name']}: runAsUser {sc.get('runAsUser')} != {uid}",
        )
        check(
            sc.get("readOnlyRootFilesystem") is True,
            f"{kind}/{name}/{c['name']}: readOnlyRootFilesystem",
        )
        check(
            sc.get("allowPrivilegeEscalation") is False,
            f"{kind}/{name}/{c['name']}: allowPrivilegeEscalation",
        )
        check(
            sc.get("capabilities", {}).get("drop") == ["ALL"],
            f"{kind}/{name}/{c['name']}: capabilities.drop",
        )
        check(
            sc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
            f"{kind}/{name}/{c['name']}: seccompProfile",
        )
        check("resources" in c, f"{kind}/{name}/{c['name']}: no resources")


def cmd_policy(rendered):
    """Security context, probes, /tmp, hooks, RBAC and labels of the default render."""
    docs = load(rendered)
    dep = find(docs, "Deployment")[0]
    job = find(docs, "Job", "-migrate")[0]
    test = [
        d
        for d in find(docs, "Pod")
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    ]
    check(len(test) == 1, "no helm test Pod")
    for d, uid in ((dep, 10001), (job, 10001)):
        spec = d["spec"]["template"]["spec"]
        _check_security(d["kind"], d["metadata"]["name"], spec, uid)
        check(spec["securityContext"].get("runAsUser") == 10001, f"{d['kind']}: pod runAsUser")
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0].get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        check(
            "/tmp" in mounts and "emptyDir" in vols.get(mounts.get("/tmp"), {}),
            f"{d['kind']}: no emptyDir at /tmp",
        )
    if test:
        _check_security(
            "Pod",
            test[0]["metadata"]["name"],
            test[0]["spec"],
            test[0]["spec"]["containers"][0]["securityContext"].get("runAsUser"),
        )
        check(
            "/readyz" in " ".join(test[0]["spec"]["containers"][0]["command"]),
            "helm test does not fetch /readyz",
        )
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    check(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness probe path")
    check(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness probe path")
    check(c["ports"][0]["containerPort"] == 8080, "container port")
    check("terminationGracePeriodSeconds" in spec, "no terminationGracePeriodSeconds")
    ann = job["metadata"]["annotations"]
    check(ann.get("helm.sh/hook") == "pre-install,pre-upgrade", f"migration hook: {ann}")
    check(job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"], "migration args")
    check(c["args"] == ["serve"], "deployment args")
    # RBAC: least privilege, exactly these rules.
    rules = sorted(
        (tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
        for role in find(docs, "Role")
        for r in role["rules"]
    )
    want = sorted(
        [
            (("",), ("pods",), ("get", "list", "watch")),
            (("coordination.k8s.io",), ("leases",), ("create", "get", "update")),
        ]
    )
    check(rules == want, f"RBAC rules {rules} != {want}")
    check(
        not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding"),
        "cluster-wide RBAC rendered",
    )
    check(len(find(docs, "PodDisruptionBudget")) == 1, "no PodDisruptionBudget")
    # Standard labels on every object.
    std = [
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
        "app.kubernetes.io/component",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/managed-by",
        "helm.sh/chart",
    ]
    for d in docs:
        labels = d["metadata"].get("labels", {})
        missing = [k for k in std if k not in labels]
        check(not missing, f"{d['kind']}/{d['metadata']['name']}: missing labels {missing}")
    print(f"policy checked on {len(docs)} objects")


def cmd_absent(rendered, kind):
    """No object of `kind` is rendered (a feature that is off by default)."""
    docs = find(load(rendered), kind)
    check(not docs, f"{kind} rendered with default values: {[d['metadata']['name'] for d in docs]}")
    print(f"no {kind} with default values")
