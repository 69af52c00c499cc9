"""The monitoring the chart ships, checked with the real promtool: the alert rules and their
unit tests, the contract's metrics only, the rendered PrometheusRule and the dashboard."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.chart import chartcheck, monitoring_checks
from tests.chart.conftest import (
    ALL_FEATURES,
    DASHBOARD,
    FULLNAME,
    NAMESPACE,
    REPO,
    RULE_TESTS,
    RULES,
    Render,
    Tools,
)

SELECTOR = f'job="{FULLNAME}", namespace="{NAMESPACE}"'


def promtool(tools: Tools, *args: str | Path) -> None:
    done = subprocess.run(
        [str(tools.need_promtool()), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_rule_file(tools: Tools) -> None:
    promtool(tools, "check", "rules", RULES)


def test_promtool_unit_tests_of_the_rules_pass(tools: Tools) -> None:
    promtool(tools, "test", "rules", RULE_TESTS)


def test_rules_and_dashboard_use_contract_metrics_only() -> None:
    chartcheck.run(monitoring_checks.cmd_code, str(REPO / "src" / "rig_conductor" / "metrics.py"))
    chartcheck.run(monitoring_checks.cmd_monitoring, str(RULES), str(DASHBOARD))


def test_the_prometheus_rule_renders_the_rule_file(
    tools: Tools, render: Render, tmp_path: Path
) -> None:
    # Defaults: no PrometheusRule; enabled: the file's rules scoped to job and namespace.
    chartcheck.run(chartcheck.cmd_absent, str(render()), "PrometheusRule")
    enabled = render("--set", "metrics.prometheusRule.enabled=true", name="enabled")
    out = tmp_path / "rules-default.rules.yaml"
    chartcheck.run(
        monitoring_checks.cmd_rules_sync, str(enabled), str(RULES), SELECTOR, "-", str(out)
    )
    promtool(tools, "check", "rules", out)
    # Overrides and alert labels (all features).
    every = render("-f", ALL_FEATURES, name="all")
    out = tmp_path / "rules-all.rules.yaml"
    chartcheck.run(
        monitoring_checks.cmd_rules_sync,
        str(every),
        str(RULES),
        SELECTOR,
        str(ALL_FEATURES),
        str(out),
    )
    promtool(tools, "check", "rules", out)
    # The unit tests pass on the rendered rules too. Regex matchers add no labels to absent(),
    # so the expected alerts are those of the file.
    selector = 'job=~"rig-conductor", namespace=~"rig-system"'
    values = tmp_path / "sel-values.yaml"
    values.write_text(
        f"metrics:\n  prometheusRule:\n    enabled: true\n    selector: '{selector}'\n"
    )
    rendered = render("-f", values, name="rules-tests")
    rules, tests = tmp_path / "rules-tests.rules.yaml", tmp_path / "rules-tests.test.yaml"
    chartcheck.run(
        monitoring_checks.cmd_rules_sync, str(rendered), str(RULES), selector, "-", str(rules)
    )
    chartcheck.run(monitoring_checks.cmd_rule_tests, str(RULE_TESTS), str(rules), str(tests))
    promtool(tools, "test", "rules", tests)


def test_runbook_urls_follow_the_published_docs_when_a_base_is_set(render: Render) -> None:
    import yaml

    base = "https://docs.example.com/rig/runbooks/"
    rendered = render(
        "--set", "metrics.prometheusRule.enabled=true",
        "--set", f"metrics.prometheusRule.runbookBaseUrl={base}",
    )  # fmt: skip
    (rule,) = [
        d for d in yaml.safe_load_all(rendered.read_text()) if d and d["kind"] == "PrometheusRule"
    ]
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    assert alerts
    for alert in alerts:
        assert alert["annotations"]["runbook_url"] == f"{base}{alert['alert']}/"


def test_dashboard_queries_parse_and_the_config_map_carries_it(
    tools: Tools, render: Render, tmp_path: Path
) -> None:
    out = tmp_path / "dashboard.rules.yaml"
    chartcheck.run(monitoring_checks.cmd_dashboard_rules, str(DASHBOARD), str(out))
    promtool(tools, "check", "rules", out)  # every query of the dashboard parses as PromQL
    chartcheck.run(chartcheck.cmd_absent, str(render()), "ConfigMap")
    every = render("-f", ALL_FEATURES, name="all")
    chartcheck.run(
        monitoring_checks.cmd_dashboard, str(every), str(DASHBOARD), "monitoring",
        "grafana_dashboard", "1",
    )  # fmt: skip
    labelled = render(
        "--set", "grafanaDashboard.enabled=true",
        "--set", "grafanaDashboard.label=example.com/dashboard",
        "--set-string", "grafanaDashboard.labelValue=rig",
        name="label",
    )  # fmt: skip
    chartcheck.run(
        monitoring_checks.cmd_dashboard, str(labelled), str(DASHBOARD), NAMESPACE,
        "example.com/dashboard", "rig",
    )  # fmt: skip
