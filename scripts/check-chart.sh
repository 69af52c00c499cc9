#!/usr/bin/env bash
# Static checks of the Helm chart and the Dockerfile.
#
#   scripts/check-chart.sh
#
# Steps: helm lint --strict (defaults, every feature on, chart-managed Secret);
# helm template | kubernetes-validate --strict against KUBE_VERSIONS;
# ServiceMonitor / PrometheusRule against tests/chart/crd-schemas.json (the
# kubernetes-validate package ships no CRD schemas); a values file with wrong
# types must FAIL helm lint; the rendered RIG_* environment, security context,
# RBAC and hooks are checked in Python; hadolint on the Dockerfile.
# Monitoring: `promtool check rules` on files/prometheus-rules.yaml and
# `promtool test rules` on tests/prometheus/rules.test.yaml; every metric and
# label the rules and files/grafana-dashboard.json query is in the contract (and
# defined so in src/rig_conductor/metrics.py); the rendered PrometheusRule is
# that file (same unit tests pass on it) and the dashboard ConfigMap carries
# the dashboard unchanged. promtool comes from Debian's prometheus package
# (override with PROMTOOL=/path/to/promtool).
# Exit status 0 only when every step passes.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

CHART="charts/rig-conductor"
ALL_FEATURES="${CHART}/ci/all-features-values.yaml"
TESTDATA="tests/chart"
# The newest Kubernetes release kubernetes-validate knows, and the oldest the
# chart supports (Chart.yaml kubeVersion).
KUBE_VERSIONS=(1.37.0 1.25.0)
RELEASE="rig"
NAMESPACE="rig-system"
FULLNAME="rig-rig-conductor"  # fullname of RELEASE with the default values
RULES="${CHART}/files/prometheus-rules.yaml"
RULE_TESTS="tests/prometheus/rules.test.yaml"
DASHBOARD="${CHART}/files/grafana-dashboard.json"
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"

bash scripts/fetch-tools.sh

TOOLS="${ROOT}/.cache/tools"
HELM="${TOOLS}/bin/helm"
PY="${TOOLS}/venv/bin/python"
KV="${TOOLS}/venv/bin/kubernetes-validate"
HADOLINT="${TOOLS}/venv/bin/hadolint"
CHECKOV="${TOOLS}/checkov/bin/checkov"

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT

# --- Python helpers (run in the tools venv: PyYAML and jsonschema) -----------
cat > "${WORK}/chartcheck.py" <<'PY'
"""Checks on rendered chart output. Usage: chartcheck.py COMMAND ARGS..."""
import json
import re
import sys

import jsonschema
import yaml

CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}

# Every non-secret RIG_* variable the chart maps from values.
CONFIG_ENV = [
    "RIG_HTTP_HOST", "RIG_HTTP_PORT", "RIG_DISPATCH_STREAM", "RIG_STREAMS",
    "RIG_AGENT_IDS", "RIG_ENTRY_STALE_MS", "RIG_AGENT_DOWN_MS",
    "RIG_SCAN_INTERVAL_S", "RIG_STARTUP_DELAY_S", "RIG_MAX_DELIVERIES",
    "RIG_DRY_RUN", "RIG_K8S_ENABLED", "RIG_K8S_NAMESPACE",
    "RIG_K8S_LABEL_SELECTOR", "RIG_LOG_FORMAT", "RIG_TENANT",
    "RIG_EVENT_RETENTION_DAYS", "RIG_ENTRY_DEADLINE_MS", "RIG_RECLAIM_DEGRADED",
    "RIG_DEGRADED_GRACE_MS", "RIG_REDIS_MODE", "RIG_REDIS_SENTINELS",
    "RIG_REDIS_SENTINEL_MASTER", "RIG_REDIS_WAIT_REPLICAS",
]
SECRET_ENV = ["RIG_DATABASE_URL", "RIG_REDIS_URL", "RIG_API_TOKENS", "RIG_REDIS_SENTINEL_PASSWORD"]
TLS_ENV = ["RIG_REDIS_TLS_CA_FILE", "RIG_REDIS_TLS_CERT_FILE", "RIG_REDIS_TLS_KEY_FILE"]

# The metrics of the contract (exposed names: counters with _total), their types
# and labels. Alert and dashboard queries may use only these.
CONTRACT = {
    "rig_reclaimed_entries_total": (
        "counter", {"stream", "group", "from_agent", "to_agent", "reason"}
    ),
    "rig_dead_lettered_entries_total": ("counter", {"stream", "group"}),
    "rig_reclaim_no_target_total": ("counter", {"stream", "group"}),
    "rig_reaper_scans_total": ("counter", {"outcome"}),
    "rig_reaper_scan_duration_seconds": ("histogram", set()),
    "rig_pending_entries": ("gauge", {"stream", "group", "agent"}),
    "rig_pending_oldest_idle_seconds": ("gauge", {"stream", "group"}),
    "rig_agent_heartbeat_age_seconds": ("gauge", {"agent"}),
    "rig_agent_up": ("gauge", {"agent"}),
    "rig_stream_consumers_without_heartbeat": ("gauge", {"stream", "group"}),
    "rig_heartbeats_received_total": ("counter", set()),
    "rig_dispatched_entries_total": ("counter", {"stream"}),
}
CONTRACT_METRICS = set(CONTRACT)
# Labels the scrape adds (static config, or prometheus-operator's ServiceMonitor).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
SEVERITIES = {"critical", "warning", "info"}

errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)


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
    schemas = json.load(open(schema_file))
    for d in load(crd_file):
        v = jsonschema.Draft7Validator(schemas[d["kind"]])
        errs = sorted(v.iter_errors(d), key=lambda e: list(e.path))
        for e in errs:
            check(False, f"{d['kind']}/{d['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}")
        if d["kind"] == "PrometheusRule":
            for g in d["spec"]["groups"]:
                for r in g["rules"]:
                    check_query(f"PrometheusRule alert {r.get('alert')}", r["expr"])
                    check("severity" in r.get("labels", {}), f"alert {r.get('alert')}: no severity label")
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
        want = {"RIG_DATABASE_URL": "database-url", "RIG_REDIS_URL": "redis-url", "RIG_API_TOKENS": "api-tokens",
                "RIG_REDIS_SENTINEL_PASSWORD": "redis-sentinel-password"}
        for env in (dep_env, job_env):
            for name, key in want.items():
                ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
                check(ref.get("name") == "rig-conductor-credentials" and ref.get("key") == key,
                      f"{name}: secretKeyRef {ref}")
            tls = {name: env.get(name, {}).get("value") for name in TLS_ENV}
            check(tls == {"RIG_REDIS_TLS_CA_FILE": "/etc/rig/redis-tls/ca.crt",
                          "RIG_REDIS_TLS_CERT_FILE": "/etc/rig/redis-tls/tls.crt",
                          "RIG_REDIS_TLS_KEY_FILE": "/etc/rig/redis-tls/tls.key"}, f"TLS env {tls}")
        for obj in (dep, job):
            spec = obj["spec"]["template"]["spec"]
            mounts = {m["name"]: m for m in spec["containers"][0].get("volumeMounts", [])}
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            check(mounts.get("redis-tls", {}).get("mountPath") == "/etc/rig/redis-tls"
                  and mounts["redis-tls"].get("readOnly") is True, f"redis-tls mount {mounts}")
            check(volumes.get("redis-tls", {}).get("secret", {}).get("secretName") == "redis-tls",
                  f"redis-tls volume {volumes.get('redis-tls')}")
    else:
        main = [n for n, s in secrets.items() if "helm.sh/hook" not in s["metadata"].get("annotations", {})]
        hook = [n for n, s in secrets.items() if "helm.sh/hook" in s["metadata"].get("annotations", {})]
        check(len(main) == 1 and len(hook) == 1, f"expected one release and one hook Secret: {sorted(secrets)}")
        if main and hook:
            ann = secrets[hook[0]]["metadata"]["annotations"]
            check(ann["helm.sh/hook"] == "pre-install,pre-upgrade", f"hook Secret hooks: {ann}")
            check(int(ann["helm.sh/hook-weight"]) < int(job["metadata"]["annotations"]["helm.sh/hook-weight"]),
                  "hook Secret must be created before the migration Job")
            check(secrets[main[0]]["data"] == secrets[hook[0]]["data"], "release and hook Secret data differ")
            for env, sname in ((dep_env, main[0]), (job_env, hook[0])):
                for name in SECRET_ENV:
                    ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef", {})
                    check(ref.get("name") == sname and ref.get("key") == name, f"{name}: secretKeyRef {ref}")
            check("checksum/secret" in dep["spec"]["template"]["metadata"].get("annotations", {}),
                  "Deployment has no checksum/secret annotation")
    print(f"secret wiring ({mode}) checked")


def _check_security(kind, name, pod_spec, uid):
    psc = pod_spec.get("securityContext", {})
    check(psc.get("runAsNonRoot") is True, f"{kind}/{name}: pod runAsNonRoot")
    check(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{kind}/{name}: pod seccompProfile")
    for c in pod_spec["containers"]:
        sc = c.get("securityContext", {})
        check(sc.get("runAsNonRoot") is True, f"{kind}/{name}/{c['name']}: runAsNonRoot")
        check(sc.get("runAsUser") == uid, f"{kind}/{name}/{c['name']}: runAsUser {sc.get('runAsUser')} != {uid}")
        check(sc.get("readOnlyRootFilesystem") is True, f"{kind}/{name}/{c['name']}: readOnlyRootFilesystem")
        check(sc.get("allowPrivilegeEscalation") is False, f"{kind}/{name}/{c['name']}: allowPrivilegeEscalation")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{kind}/{name}/{c['name']}: capabilities.drop")
        check(sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{kind}/{name}/{c['name']}: seccompProfile")
        check("resources" in c, f"{kind}/{name}/{c['name']}: no resources")


def cmd_policy(rendered):
    """Security context, probes, /tmp, hooks, RBAC and labels of the default render."""
    docs = load(rendered)
    dep = find(docs, "Deployment")[0]
    job = find(docs, "Job", "-migrate")[0]
    test = [d for d in find(docs, "Pod") if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    check(len(test) == 1, "no helm test Pod")
    for d, uid in ((dep, 10001), (job, 10001)):
        spec = d["spec"]["template"]["spec"]
        _check_security(d["kind"], d["metadata"]["name"], spec, uid)
        check(spec["securityContext"].get("runAsUser") == 10001, f"{d['kind']}: pod runAsUser")
        mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0].get("volumeMounts", [])}
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        check("/tmp" in mounts and "emptyDir" in vols.get(mounts.get("/tmp"), {}), f"{d['kind']}: no emptyDir at /tmp")
    if test:
        _check_security("Pod", test[0]["metadata"]["name"], test[0]["spec"], test[0]["spec"]["containers"][0]["securityContext"].get("runAsUser"))
        check("/readyz" in " ".join(test[0]["spec"]["containers"][0]["command"]), "helm test does not fetch /readyz")
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
        for role in find(docs, "Role") for r in role["rules"])
    want = sorted([(("",), ("pods",), ("get", "list", "watch")),
                   (("coordination.k8s.io",), ("leases",), ("create", "get", "update"))])
    check(rules == want, f"RBAC rules {rules} != {want}")
    check(not find(docs, "ClusterRole") and not find(docs, "ClusterRoleBinding"), "cluster-wide RBAC rendered")
    check(len(find(docs, "PodDisruptionBudget")) == 1, "no PodDisruptionBudget")
    # Standard labels on every object.
    std = ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
           "app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by",
           "helm.sh/chart"]
    for d in docs:
        labels = d["metadata"].get("labels", {})
        missing = [k for k in std if k not in labels]
        check(not missing, f"{d['kind']}/{d['metadata']['name']}: missing labels {missing}")
    print(f"policy checked on {len(docs)} objects")


def series_of(name):
    """Contract family of an exposed series name (histograms: _bucket, _sum, _count), or None."""
    if name in CONTRACT:
        return name
    base, _, suffix = name.rpartition("_")
    if suffix in ("bucket", "sum", "count") and CONTRACT.get(base, ("",))[0] == "histogram":
        return base
    return None


def check_query(where, expr):
    """Metric names, matcher labels and by/without labels of one PromQL query."""
    expr = str(expr)
    names = re.findall(r"\brig_[a-z0-9_]+", expr)
    check(names, f"{where}: queries no rig_* metric: {expr}")
    allowed = set(TARGET_LABELS)
    for name in names:
        family = series_of(name)
        check(family is not None, f"{where}: metric {name} is not in the contract")
        if family is None:
            continue
        labels = CONTRACT[family][1] | TARGET_LABELS
        if name.endswith("_bucket"):
            labels = labels | {"le"}
        allowed |= labels
        for sel in re.findall(r"\b" + name + r"\{([^}]*)\}", expr):
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", sel):
                check(label in labels, f"{where}: {name} has no label {label!r}")
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (x.strip() for x in group.split(","))):
            check(label in allowed, f"{where}: aggregates by {label!r}, which no queried metric has")
    lv = re.findall(r"label_values\(\s*([a-z0-9_]+)[^,]*,\s*([a-zA-Z0-9_]+)\s*\)", expr)
    for name, label in lv:
        family = series_of(name)
        if family:
            check(label in CONTRACT[family][1] | TARGET_LABELS, f"{where}: {name} has no label {label!r}")


def cmd_code(metrics_py):
    """The contract metrics are defined in metrics_py with the same type and labels."""
    import ast
    tree = ast.parse(open(metrics_py).read())
    defined = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kind = node.func.id.lower()
        if kind not in ("counter", "gauge", "histogram") or not node.args:
            continue
        if not isinstance(node.args[0], ast.Constant):
            continue
        name = node.args[0].value + ("_total" if kind == "counter" else "")
        labels = set()
        if len(node.args) > 2 and isinstance(node.args[2], (ast.List, ast.Tuple)):
            labels = {e.value for e in node.args[2].elts if isinstance(e, ast.Constant)}
        defined[name] = (kind, labels)
    for name, want in CONTRACT.items():
        check(defined.get(name) == want, f"{metrics_py}: {name} is {defined.get(name)}, contract says {want}")
    print(f"{len(CONTRACT)} contract metrics defined in {metrics_py} with their types and labels")


def cmd_monitoring(rules_file, dashboard_file):
    """The rule file and the dashboard: structure, and only contract metrics and labels."""
    rules = yaml.safe_load(open(rules_file))
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    names = [r.get("alert") for r in alerts]
    check(len(names) == len(set(names)), f"{rules_file}: duplicate alert names {names}")
    for r in alerts:
        where = f"{rules_file}: alert {r.get('alert')}"
        check("alert" in r, f"{where}: recording rules do not belong here")
        check_query(where, r["expr"])
        check(r.get("labels", {}).get("severity") in SEVERITIES, f"{where}: severity not one of {sorted(SEVERITIES)}")
        ann = r.get("annotations", {})
        missing = {"summary", "description", "runbook"} - set(ann)
        check(not missing, f"{where}: missing annotations {sorted(missing)}")
    print(f"{rules_file}: {len(alerts)} alerts checked")

    raw = open(dashboard_file).read()
    try:
        dash = json.loads(raw)
    except ValueError as e:
        check(False, f"{dashboard_file}: not valid JSON: {e}")
        return
    check(dash.get("schemaVersion", 0) >= 36, f"{dashboard_file}: schemaVersion {dash.get('schemaVersion')}")
    check(dash.get("uid") and dash.get("title"), f"{dashboard_file}: no uid or title")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(ds.get("type") == "datasource" and ds.get("query") == "prometheus",
          f"{dashboard_file}: no datasource variable of type prometheus")
    for v in variables.values():
        if v.get("type") == "query":
            q = v.get("query")
            check_query(f"{dashboard_file}: variable {v['name']}", q.get("query") if isinstance(q, dict) else q)
    panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
    ids = [p.get("id") for p in dash.get("panels", [])]
    check(len(ids) == len(set(ids)), f"{dashboard_file}: duplicate panel ids")
    queries = 0
    for p in panels:
        where = f"{dashboard_file}: panel {p.get('title')!r}"
        check(p.get("datasource", {}).get("uid") == "${datasource}", f"{where}: datasource is not $datasource")
        check("gridPos" in p, f"{where}: no gridPos")
        check(p.get("targets"), f"{where}: no queries")
        for t in p.get("targets", []):
            check(t.get("datasource", {}).get("uid") == "${datasource}", f"{where}: query datasource is not $datasource")
            check_query(where, t.get("expr", ""))
            queries += 1
    used = set()
    for q in re.findall(r"\brig_[a-z0-9_]+", raw):
        used.add(series_of(q))
    print(f"{dashboard_file}: {len(panels)} panels, {queries} queries checked; "
          f"contract metrics not shown: {sorted(CONTRACT_METRICS - used) or 'none'}")


def apply_values(rule, values):
    """What the chart should render for one rule of the file, given the chart values."""
    pr = (values.get("metrics") or {}).get("prometheusRule") or {}
    o = (pr.get("overrides") or {}).get(rule["alert"], {})
    if o.get("enabled") is False:
        return None
    out = {"alert": rule["alert"], "expr": str(o.get("expr", rule["expr"])).strip()}
    if o.get("for", rule.get("for")):
        out["for"] = o.get("for", rule.get("for"))
    labels = {**(pr.get("alertLabels") or {}), **rule.get("labels", {}), **(o.get("labels") or {})}
    annotations = {**rule.get("annotations", {}), **(o.get("annotations") or {})}
    if labels:
        out["labels"] = labels
    if annotations:
        out["annotations"] = annotations
    return out


def cmd_rules_sync(rendered, rules_file, selector, values_file, out_file):
    """The rendered PrometheusRule is the rule file (plus values), every rig_* selector scoped."""
    docs = find(load(rendered), "PrometheusRule")
    check(len(docs) == 1, f"expected one PrometheusRule, found {len(docs)}")
    if not docs:
        return
    values = yaml.safe_load(open(values_file)) if values_file != "-" else {}
    got = docs[0]["spec"]["groups"]
    want_groups = yaml.safe_load(open(rules_file))["groups"]
    check([g["name"] for g in got] == [g["name"] for g in want_groups],
          f"groups {[g['name'] for g in got]} != {[g['name'] for g in want_groups]}")
    for g_got, g_want in zip(got, want_groups):
        want = [w for w in (apply_values(r, values) for r in g_want["rules"]) if w]
        check([r["alert"] for r in g_got["rules"]] == [r["alert"] for r in want],
              f"group {g_got['name']}: alerts {[r['alert'] for r in g_got['rules']]} != {[r['alert'] for r in want]}")
        for r_got, r_want in zip(g_got["rules"], want):
            expr = r_got["expr"]
            bare = [m.group() for m in re.finditer(r"\brig_[a-z0-9_]+", expr)
                    if not expr.startswith("{" + selector, m.end())]
            check(not bare, f"{r_got['alert']}: selectors not scoped to {{{selector}}}: {bare}")
            r_got = dict(r_got, expr=expr.replace("{" + selector + ", ", "{").replace("{" + selector + "}", ""))
            check(r_got == r_want, f"{r_got['alert']}: rendered\n  {r_got}\nexpected (file + values)\n  {r_want}")
    with open(out_file, "w") as f:
        yaml.safe_dump({"groups": got}, f, sort_keys=False)
    print(f"PrometheusRule = {rules_file} + values: {sum(len(g['rules']) for g in got)} alerts, selector {{{selector}}}")


def cmd_rule_tests(test_file, rules_file, out_file):
    """A copy of the promtool unit tests that loads rules_file instead."""
    tests = yaml.safe_load(open(test_file))
    tests["rule_files"] = [rules_file]
    with open(out_file, "w") as f:
        yaml.safe_dump(tests, f, sort_keys=False)


def cmd_dashboard(rendered, dashboard_file, namespace, label, value):
    """The dashboard ConfigMap: sidecar label, namespace, the file's JSON unchanged."""
    maps = [d for d in find(load(rendered), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    check(len(maps) == 1, f"expected one dashboard ConfigMap, found {len(maps)}")
    if not maps:
        return
    cm = maps[0]
    check(cm["metadata"]["namespace"] == namespace, f"ConfigMap namespace {cm['metadata']['namespace']} != {namespace}")
    check(cm["metadata"]["labels"].get(label) == value, f"ConfigMap label {label}={cm['metadata']['labels'].get(label)!r}, expected {value!r}")
    data = cm.get("data", {})
    check(list(data) == ["rig-conductor.json"], f"ConfigMap keys {list(data)}")
    raw = open(dashboard_file).read()
    check(data.get("rig-conductor.json", "").strip() == raw.strip(), "ConfigMap data differs from the dashboard file")
    check(json.loads(data.get("rig-conductor.json", "null")) == json.loads(raw), "ConfigMap JSON differs from the dashboard file")
    print(f"ConfigMap {namespace}/{cm['metadata']['name']} ({label}={value}) carries {dashboard_file}")


def cmd_dashboard_rules(dashboard_file, out_file):
    """Every dashboard query as a recording rule, so `promtool check rules` parses the PromQL."""
    dash = json.load(open(dashboard_file))
    subst = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
             "$job": ".+", "$stream": ".*"}
    exprs = []
    for p in dash.get("panels", []):
        exprs += [t["expr"] for t in p.get("targets", []) if t.get("expr")]
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.match(r"label_values\((.*),\s*[a-zA-Z0-9_]+\)$", q or "")
        if v.get("type") == "query" and m:
            exprs.append(m.group(1))
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in sorted(subst.items(), key=lambda kv: -len(kv[0])):
            expr = expr.replace(var, value)
        check("$" not in expr, f"unknown variable in dashboard query: {expr}")
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    with open(out_file, "w") as f:
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}, f, sort_keys=False)
    print(f"{len(rules)} dashboard queries written to {out_file}")


def cmd_absent(rendered, kind):
    """No object of `kind` is rendered (a feature that is off by default)."""
    docs = find(load(rendered), kind)
    check(not docs, f"{kind} rendered with default values: {[d['metadata']['name'] for d in docs]}")
    print(f"no {kind} with default values")


def main():
    cmd, *args = sys.argv[1:]
    globals()["cmd_" + cmd.replace("-", "_")](*args)
    for e in errors:
        print("FAIL:", e)
    sys.exit(1 if errors else 0)


main()
PY

# --- step runner --------------------------------------------------------------
declare -a RESULTS=()
FAILED=0

step() {
    local name="$1"
    shift
    local log="${WORK}/step-${#RESULTS[@]}.log"
    local start=${SECONDS}
    set +e
    ( set -e; "$@" ) > "${log}" 2>&1
    local rc=$?
    set -e
    local took=$((SECONDS - start))
    if [[ ${rc} -eq 0 ]]; then
        RESULTS+=("PASS  ${name} (${took}s)")
        printf 'PASS  %s\n' "${name}"
    else
        RESULTS+=("FAIL  ${name} (${took}s)")
        FAILED=$((FAILED + 1))
        printf 'FAIL  %s\n' "${name}"
        sed 's/^/      /' "${log}"
    fi
}

render() {  # render OUT [helm template args...]
    local out="$1"
    shift
    "${HELM}" template "${RELEASE}" "${CHART}" --namespace "${NAMESPACE}" \
        --kube-version "${KUBE_VERSIONS[0]}" "$@" > "${out}"
}

lint_ok() {
    "${HELM}" lint --strict "${CHART}" --namespace "${NAMESPACE}" "$@"
}

lint_must_fail() {
    local out="${WORK}/bad-lint.txt"
    if "${HELM}" lint --strict "${CHART}" --namespace "${NAMESPACE}" -f "${TESTDATA}/bad-values.yaml" > "${out}" 2>&1; then
        cat "${out}"
        echo "helm lint passed on ${TESTDATA}/bad-values.yaml; the schema must reject it"
        return 1
    fi
    # Make sure it failed for the schema reasons, not something unrelated.
    grep -q 'replicaCount' "${out}" || { cat "${out}"; echo "no error about replicaCount"; return 1; }
    grep -q 'entryStaleMs' "${out}" || { cat "${out}"; echo "no error about entryStaleMs"; return 1; }
    echo "helm lint rejected bad-values.yaml as expected:"
    grep -E 'replicaCount|entryStaleMs' "${out}" | sort -u
}

validate() {  # validate NAME EXPECTED_CRD_KINDS [helm template args...]
    local name="$1" crds="$2"
    shift 2
    local rendered="${WORK}/${name}.yaml"
    render "${rendered}" "$@"
    "${PY}" "${WORK}/chartcheck.py" split "${rendered}" "${WORK}/${name}-core.yaml" "${WORK}/${name}-crd.yaml" "${crds}"
    local args=() v
    for v in "${KUBE_VERSIONS[@]}"; do args+=(-k "${v}"); done
    local out="${WORK}/${name}-kv.txt"
    local rc=0
    "${KV}" --strict --quiet "${args[@]}" "${WORK}/${name}-core.yaml" > "${out}" 2>&1 || rc=$?
    cat "${out}"
    # kubernetes-validate only warns about a kind it has no schema for; every
    # core kind must have one, so a warning is a failure here.
    if [[ ${rc} -ne 0 ]] || grep -q . "${out}"; then
        return 1
    fi
    echo "kubernetes-validate --strict: all core objects valid for ${KUBE_VERSIONS[*]}"
    if [[ -n "${crds}" ]]; then
        "${PY}" "${WORK}/chartcheck.py" crds "${WORK}/${name}-crd.yaml" "${TESTDATA}/crd-schemas.json"
    fi
}

env_mapping() {
    local rendered="${WORK}/env.yaml"
    render "${rendered}" -f "${TESTDATA}/env-values.yaml" --set config.entryStaleMs=1234
    "${PY}" "${WORK}/chartcheck.py" env "${rendered}" '{
        "RIG_HTTP_HOST": "::", "RIG_HTTP_PORT": "9091", "RIG_DISPATCH_STREAM": "env:dispatch",
        "RIG_STREAMS": "env:a,env:b*", "RIG_AGENT_IDS": "agent-a,agent-b",
        "RIG_ENTRY_STALE_MS": "1234", "RIG_AGENT_DOWN_MS": "86400000",
        "RIG_SCAN_INTERVAL_S": "2.5", "RIG_STARTUP_DELAY_S": "0", "RIG_MAX_DELIVERIES": "7",
        "RIG_ENTRY_DEADLINE_MS": "0", "RIG_RECLAIM_DEGRADED": "false",
        "RIG_DEGRADED_GRACE_MS": "4321", "RIG_REDIS_MODE": "sentinel",
        "RIG_REDIS_SENTINELS": "s-0:26379,s-1:26379", "RIG_REDIS_SENTINEL_MASTER": "rig-master",
        "RIG_REDIS_WAIT_REPLICAS": "1",
        "RIG_DRY_RUN": "true", "RIG_K8S_ENABLED": "false", "RIG_K8S_NAMESPACE": "agents-ns",
        "RIG_K8S_LABEL_SELECTOR": "role=agent", "RIG_LOG_FORMAT": "text",
        "RIG_TENANT": "tenant-x", "RIG_EVENT_RETENTION_DAYS": "45"}'
    rendered="${WORK}/env-default.yaml"
    render "${rendered}"
    "${PY}" "${WORK}/chartcheck.py" env "${rendered}" '{
        "RIG_HTTP_PORT": "8080", "RIG_ENTRY_STALE_MS": "300000", "RIG_AGENT_DOWN_MS": "600000",
        "RIG_ENTRY_DEADLINE_MS": "3600000", "RIG_RECLAIM_DEGRADED": "true",
        "RIG_DEGRADED_GRACE_MS": "300000", "RIG_REDIS_MODE": "standalone",
        "RIG_REDIS_SENTINELS": "", "RIG_REDIS_SENTINEL_MASTER": "mymaster",
        "RIG_REDIS_WAIT_REPLICAS": "0",
        "RIG_K8S_NAMESPACE": "'"${NAMESPACE}"'", "RIG_EVENT_RETENTION_DAYS": "30",
        "RIG_STREAMS": "rig:dispatch,assignments:*", "RIG_DRY_RUN": "false"}'
}

policy() {
    local rendered="${WORK}/policy.yaml"
    render "${rendered}"
    "${PY}" "${WORK}/chartcheck.py" policy "${rendered}"
}

secret_wiring() {
    render "${WORK}/sec-existing.yaml" -f "${ALL_FEATURES}"
    "${PY}" "${WORK}/chartcheck.py" secrets "${WORK}/sec-existing.yaml" existing
    render "${WORK}/sec-chart.yaml" -f "${TESTDATA}/chart-secret-values.yaml"
    "${PY}" "${WORK}/chartcheck.py" secrets "${WORK}/sec-chart.yaml" chart
}

hadolint_dockerfile() {
    local out
    out="$("${HADOLINT}" --no-color Dockerfile 2>&1)" || { echo "${out}"; return 1; }
    if [[ -n "${out}" ]]; then
        echo "${out}"
        return 1
    fi
    echo "hadolint: no findings"
}

checkov_scan() {
    # Every finding is fixed in the chart or skipped there with its reason (the
    # checkov.io/skipN annotations of rig-conductor.checkovSkips, the Dockerfile's
    # checkov:skip comment); anything else fails. --skip-download: nothing leaves the machine.
    local name out
    for name in default all-features chart-secret; do
        case "${name}" in
            default) render "${WORK}/ck-${name}.yaml" ;;
            all-features) render "${WORK}/ck-${name}.yaml" -f "${ALL_FEATURES}" ;;
            chart-secret) render "${WORK}/ck-${name}.yaml" -f "${TESTDATA}/chart-secret-values.yaml" ;;
        esac
    done
    out="$("${CHECKOV}" --framework kubernetes --skip-download --compact --quiet \
        -f "${WORK}/ck-default.yaml" -f "${WORK}/ck-all-features.yaml" -f "${WORK}/ck-chart-secret.yaml" 2>&1)" \
        || { echo "${out}"; return 1; }
    echo "checkov (chart): ${out:-no findings}" | head -1
    out="$("${CHECKOV}" --framework dockerfile --skip-download --compact --quiet -f Dockerfile 2>&1)" \
        || { echo "${out}"; return 1; }
    echo "checkov (Dockerfile): ${out:-no findings}" | head -1
    "${PY}" - "${WORK}/ck-default.yaml" <<'CHECK'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    for key, value in ((doc or {}).get("metadata", {}).get("annotations") or {}).items():
        if key.startswith("checkov.io/skip"):
            check_id, _, reason = value.partition("=")
            if not check_id.startswith("CKV") or len(reason.strip()) < 20:
                sys.exit(f"{doc['kind']}: {key} skips {check_id} without a reason")
print("every checkov skip names its reason")
CHECK
}

need_promtool() {
    if [[ -z "${PROMTOOL}" || ! -x "${PROMTOOL}" ]]; then
        echo "promtool not found: install Debian's prometheus package (apt-get install prometheus)"
        echo "or set PROMTOOL=/path/to/promtool"
        return 1
    fi
}

promtool_check_rules() {
    need_promtool
    "${PROMTOOL}" check rules "${RULES}"
}

promtool_test_rules() {
    need_promtool
    "${PROMTOOL}" test rules "${RULE_TESTS}"
}

monitoring_contract() {
    "${PY}" "${WORK}/chartcheck.py" code src/rig_conductor/metrics.py
    "${PY}" "${WORK}/chartcheck.py" monitoring "${RULES}" "${DASHBOARD}"
}

rules_render() {
    need_promtool
    local rendered="${WORK}/rules-default.yaml"
    # Defaults: no PrometheusRule; enabled: the file's rules scoped to job and namespace.
    render "${rendered}"
    "${PY}" "${WORK}/chartcheck.py" absent "${rendered}" PrometheusRule
    render "${rendered}" --set metrics.prometheusRule.enabled=true
    "${PY}" "${WORK}/chartcheck.py" rules-sync "${rendered}" "${RULES}" \
        "job=\"${FULLNAME}\", namespace=\"${NAMESPACE}\"" - "${WORK}/rules-default.rules.yaml"
    "${PROMTOOL}" check rules "${WORK}/rules-default.rules.yaml"
    # Overrides and alert labels (all features).
    rendered="${WORK}/rules-all.yaml"
    render "${rendered}" -f "${ALL_FEATURES}"
    "${PY}" "${WORK}/chartcheck.py" rules-sync "${rendered}" "${RULES}" \
        "job=\"${FULLNAME}\", namespace=\"${NAMESPACE}\"" "${ALL_FEATURES}" "${WORK}/rules-all.rules.yaml"
    "${PROMTOOL}" check rules "${WORK}/rules-all.rules.yaml"
    # The unit tests pass on the rendered rules too. Regex matchers add no labels to
    # absent(), so the expected alerts are the same as for the file.
    local sel='job=~"rig-conductor", namespace=~"rig-system"'
    rendered="${WORK}/rules-tests.yaml"
    printf 'metrics:\n  prometheusRule:\n    enabled: true\n    selector: %s\n' "'${sel}'" > "${WORK}/sel-values.yaml"
    render "${rendered}" -f "${WORK}/sel-values.yaml"
    "${PY}" "${WORK}/chartcheck.py" rules-sync "${rendered}" "${RULES}" "${sel}" - "${WORK}/rules-tests.rules.yaml"
    "${PY}" "${WORK}/chartcheck.py" rule-tests "${RULE_TESTS}" "${WORK}/rules-tests.rules.yaml" "${WORK}/rules-tests.test.yaml"
    "${PROMTOOL}" test rules "${WORK}/rules-tests.test.yaml"
}

dashboard_render() {
    need_promtool
    # promtool parses every query of the dashboard (as recording rules).
    "${PY}" "${WORK}/chartcheck.py" dashboard-rules "${DASHBOARD}" "${WORK}/dashboard.rules.yaml"
    "${PROMTOOL}" check rules "${WORK}/dashboard.rules.yaml"
    local rendered="${WORK}/dash-default.yaml"
    render "${rendered}"
    "${PY}" "${WORK}/chartcheck.py" absent "${rendered}" ConfigMap
    rendered="${WORK}/dash-all.yaml"
    render "${rendered}" -f "${ALL_FEATURES}"
    "${PY}" "${WORK}/chartcheck.py" dashboard "${rendered}" "${DASHBOARD}" monitoring grafana_dashboard 1
    rendered="${WORK}/dash-label.yaml"
    render "${rendered}" --set grafanaDashboard.enabled=true \
        --set grafanaDashboard.label=example.com/dashboard --set-string grafanaDashboard.labelValue=rig
    "${PY}" "${WORK}/chartcheck.py" dashboard "${rendered}" "${DASHBOARD}" "${NAMESPACE}" example.com/dashboard rig
}

echo "== rig-conductor chart checks (helm $("${HELM}" version --short), kubernetes ${KUBE_VERSIONS[*]})"
step "helm lint --strict (defaults)"                 lint_ok
step "helm lint --strict (all features)"             lint_ok -f "${ALL_FEATURES}"
step "helm lint --strict (chart-managed Secret)"     lint_ok -f "${TESTDATA}/chart-secret-values.yaml"
step "helm lint rejects tests/chart/bad-values.yaml" lint_must_fail
step "kubernetes-validate (defaults)"                validate default "" 
step "kubernetes-validate (all features + CRDs)"     validate all-features "PrometheusRule,ServiceMonitor" -f "${ALL_FEATURES}"
step "kubernetes-validate (chart-managed Secret)"    validate chart-secret "" -f "${TESTDATA}/chart-secret-values.yaml"
step "values reach RIG_* env (exact names)"          env_mapping
step "security context, probes, hooks, RBAC"         policy
step "secret wiring (existingSecret, chart Secret)"  secret_wiring
step "hadolint Dockerfile"                           hadolint_dockerfile
step "checkov (rendered chart, Dockerfile)"          checkov_scan
step "promtool check rules (files/prometheus-rules.yaml)" promtool_check_rules
step "promtool test rules (tests/prometheus)"        promtool_test_rules
step "rules and dashboard use contract metrics only" monitoring_contract
step "PrometheusRule renders the rule file"          rules_render
step "dashboard queries parse; ConfigMap carries it" dashboard_render

echo
echo "== summary"
printf '%s\n' "${RESULTS[@]}"
if [[ ${FAILED} -ne 0 ]]; then
    echo "FAIL: ${FAILED} of ${#RESULTS[@]} checks failed"
    exit 1
fi
echo "PASS: all ${#RESULTS[@]} checks passed"
