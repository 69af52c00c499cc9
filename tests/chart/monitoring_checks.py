"""Checks of the monitoring the chart ships: the alert rules, the dashboard, their PromQL, and
that they use the contract's metrics only. Driven by tests/chart/test_monitoring.py."""

import ast
import json
import re
from pathlib import Path

import yaml

from tests.chart.chartcheck import check, find, load

# The metrics of the contract (exposed names: counters with _total), their types
# and labels. Alert and dashboard queries may use only these.
CONTRACT = {
    "rig_reclaimed_entries_total": (
        "counter",
        {"stream", "group", "from_agent", "to_agent", "reason"},
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
    "rig_build_info": ("gauge", {"version", "revision"}),
    "rig_work_finished_total": ("counter", {"stream", "group", "outcome"}),
    "rig_work_duration_seconds": ("histogram", {"stream", "group"}),
    "rig_stream_group_lag": ("gauge", {"stream", "group"}),
    "rig_reclaim_delay_seconds": ("histogram", {"stream", "group", "reason"}),
    # Beyond the contract: the last audit's verdict (rig-conductor audit records it).
    "rig_audit_lost_entries": ("gauge", set()),
    "rig_audit_duplicate_issues": ("gauge", set()),
    "rig_audit_last_finished_timestamp_seconds": ("gauge", set()),
    # Beyond the contract: blind spells, the time no conductor could take heartbeats in.
    "rig_blind_seconds_total": ("counter", set()),
    "rig_reaper_blind_seconds": ("gauge", set()),
}
CONTRACT_METRICS = set(CONTRACT)
# Labels the scrape adds (static config, or prometheus-operator's ServiceMonitor).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
SEVERITIES = {"critical", "warning", "info"}


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
            check(
                label in allowed, f"{where}: aggregates by {label!r}, which no queried metric has"
            )
    lv = re.findall(r"label_values\(\s*([a-z0-9_]+)[^,]*,\s*([a-zA-Z0-9_]+)\s*\)", expr)
    for name, label in lv:
        family = series_of(name)
        if family:
            check(
                label in CONTRACT[family][1] | TARGET_LABELS,
                f"{where}: {name} has no label {label!r}",
            )


def cmd_code(metrics_py):
    """The contract metrics are defined in metrics_py with the same type and labels."""

    tree = ast.parse(Path(metrics_py).read_text())
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
        check(
            defined.get(name) == want,
            f"{metrics_py}: {name} is {defined.get(name)}, contract says {want}",
        )
    print(f"{len(CONTRACT)} contract metrics defined in {metrics_py} with their types and labels")


def cmd_monitoring(rules_file, dashboard_file):
    """The rule file and the dashboard: structure, and only contract metrics and labels."""
    rules = yaml.safe_load(Path(rules_file).read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    names = [r.get("alert") for r in alerts]
    check(len(names) == len(set(names)), f"{rules_file}: duplicate alert names {names}")
    for r in alerts:
        where = f"{rules_file}: alert {r.get('alert')}"
        check("alert" in r, f"{where}: recording rules do not belong here")
        check_query(where, r["expr"])
        check(
            r.get("labels", {}).get("severity") in SEVERITIES,
            f"{where}: severity not one of {sorted(SEVERITIES)}",
        )
        ann = r.get("annotations", {})
        missing = {"summary", "description", "runbook"} - set(ann)
        check(not missing, f"{where}: missing annotations {sorted(missing)}")
    print(f"{rules_file}: {len(alerts)} alerts checked")

    raw = Path(dashboard_file).read_text()
    try:
        dash = json.loads(raw)
    except ValueError as e:
        check(False, f"{dashboard_file}: not valid JSON: {e}")
        return
    check(
        dash.get("schemaVersion", 0) >= 36,
        f"{dashboard_file}: schemaVersion {dash.get('schemaVersion')}",
    )
    check(dash.get("uid") and dash.get("title"), f"{dashboard_file}: no uid or title")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    check(
        ds.get("type") == "datasource" and ds.get("query") == "prometheus",
        f"{dashboard_file}: no datasource variable of type prometheus",
    )
    for v in variables.values():
        if v.get("type") == "query":
            q = v.get("query")
            check_query(
                f"{dashboard_file}: variable {v['name']}",
                q.get("query") if isinstance(q, dict) else q,
            )
    panels = [p for p in dash.get("panels", []) if p.get("type") != "row"]
    ids = [p.get("id") for p in dash.get("panels", [])]
    check(len(ids) == len(set(ids)), f"{dashboard_file}: duplicate panel ids")
    queries = 0
    for p in panels:
        where = f"{dashboard_file}: panel {p.get('title')!r}"
        check(
            p.get("datasource", {}).get("uid") == "${datasource}",
            f"{where}: datasource is not $datasource",
        )
        check("gridPos" in p, f"{where}: no gridPos")
        check(p.get("targets"), f"{where}: no queries")
        for t in p.get("targets", []):
            check(
                t.get("datasource", {}).get("uid") == "${datasource}",
                f"{where}: query datasource is not $datasource",
            )
            check_query(where, t.get("expr", ""))
            queries += 1
    used = set()
    for q in re.findall(r"\brig_[a-z0-9_]+", raw):
        used.add(series_of(q))
    print(
        f"{dashboard_file}: {len(panels)} panels, {queries} queries checked; "
        f"contract metrics not shown: {sorted(CONTRACT_METRICS - used) or 'none'}"
    )


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
    values = yaml.safe_load(Path(values_file).read_text()) if values_file != "-" else {}
    got = docs[0]["spec"]["groups"]
    want_groups = yaml.safe_load(Path(rules_file).read_text())["groups"]
    check(
        [g["name"] for g in got] == [g["name"] for g in want_groups],
        f"groups {[g['name'] for g in got]} != {[g['name'] for g in want_groups]}",
    )
    for g_got, g_want in zip(got, want_groups, strict=False):
        want = [w for w in (apply_values(r, values) for r in g_want["rules"]) if w]
        check(
            [r["alert"] for r in g_got["rules"]] == [r["alert"] for r in want],
            f"group {g_got['name']}: alerts {[r['alert'] for r in g_got['rules']]} "
            f"!= {[r['alert'] for r in want]}",
        )
        for r_got, r_want in zip(g_got["rules"], want, strict=False):
            expr = r_got["expr"]
            bare = [
                m.group()
                for m in re.finditer(r"\brig_[a-z0-9_]+", expr)
                if not expr.startswith("{" + selector, m.end())
            ]
            check(not bare, f"{r_got['alert']}: selectors not scoped to {{{selector}}}: {bare}")
            r_got = dict(
                r_got,
                expr=expr.replace("{" + selector + ", ", "{").replace("{" + selector + "}", ""),
            )
            check(
                r_got == r_want,
                f"{r_got['alert']}: rendered\n  {r_got}\nexpected (file + values)\n  {r_want}",
            )
    with open(out_file, "w") as f:
        yaml.safe_dump({"groups": got}, f, sort_keys=False)
    print(
        f"PrometheusRule = {rules_file} + values: {sum(len(g['rules']) for g in got)} alerts, "
        f"selector {{{selector}}}"
    )


def cmd_rule_tests(test_file, rules_file, out_file):
    """A copy of the promtool unit tests that loads rules_file instead."""
    tests = yaml.safe_load(Path(test_file).read_text())
    tests["rule_files"] = [rules_file]
    with open(out_file, "w") as f:
        yaml.safe_dump(tests, f, sort_keys=False)


def cmd_dashboard(rendered, dashboard_file, namespace, label, value):
    """The dashboard ConfigMap: sidecar label, namespace, the file's JSON unchanged."""
    maps = [
        d for d in find(load(rendered), "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")
    ]
    check(len(maps) == 1, f"expected one dashboard ConfigMap, found {len(maps)}")
    if not maps:
        return
    cm = maps[0]
    check(
        cm["metadata"]["namespace"] == namespace,
        f"ConfigMap namespace {cm['metadata']['namespace']} != {namespace}",
    )
    check(
        cm["metadata"]["labels"].get(label) == value,
        f"ConfigMap label {label}={cm['metadata']['labels'].get(label)!r}, expected {value!r}",
    )
    data = cm.get("data", {})
    check(list(data) == ["rig-conductor.json"], f"ConfigMap keys {list(data)}")
    raw = Path(dashboard_file).read_text()
    check(
        data.get("rig-conductor.json", "").strip() == raw.strip(),
        "ConfigMap data differs from the dashboard file",
    )
    check(
        json.loads(data.get("rig-conductor.json", "null")) == json.loads(raw),
        "ConfigMap JSON differs from the dashboard file",
    )
    print(
        f"ConfigMap {namespace}/{cm['metadata']['name']} ({label}={value}) carries {dashboard_file}"
    )


def cmd_dashboard_rules(dashboard_file, out_file):
    """Every dashboard query as a recording rule, so `promtool check rules` parses the PromQL."""
    dash = json.loads(Path(dashboard_file).read_text())
    subst = {
        "$__rate_interval": "1m",
        "$__interval": "1m",
        "$__range": "1h",
        "$job": ".+",
        "$stream": ".*",
    }
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
        yaml.safe_dump(
            {"groups": [{"name": "dashboard-queries", "rules": rules}]}, f, sort_keys=False
        )
    print(f"{len(rules)} dashboard queries written to {out_file}")
