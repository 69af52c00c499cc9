"""The documentation cannot drift from the code: generated reference pages, runbooks for every
shipped alert, and a README that links only inside the repository."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "rig-conductor" / "files" / "prometheus-rules.yaml"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_reference", REPO / "scripts" / "gen_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_pages_match_the_code() -> None:
    stale = generator().drifted()
    assert stale == [], f"{stale} out of date with the code: run `make docs-ref`"


def test_every_setting_has_a_described_row() -> None:
    from rig_conductor.agent.settings import AgentSettings
    from rig_conductor.settings import Settings

    page = (REPO / "docs" / "reference" / "settings.md").read_text()
    for model in (Settings, AgentSettings):
        for name, field in model.model_fields.items():
            assert field.description, f"RIG_{name.upper()} has no description"
            assert f"| `RIG_{name.upper()}` |" in page


def test_every_alert_links_to_a_runbook_page_that_exists() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    assert alerts
    index = (REPO / "docs" / "runbooks" / "index.md").read_text()
    for rule in alerts:
        url = rule["annotations"].get("runbook_url")
        assert url == f"docs/runbooks/{rule['alert']}.md", (rule["alert"], url)
        page = REPO / url
        assert page.is_file(), url
        assert page.read_text().startswith(f"# {rule['alert']}\n")
        assert f"({rule['alert']}.md)" in index


def test_the_readme_links_only_inside_the_repository() -> None:
    readme = (REPO / "README.md").read_text()
    assert "../" not in readme
    for target in re.findall(r"\]\(([^)]+)\)", readme):
        if target.startswith(("http://", "https://", "#")):
            continue
        assert (REPO / target.split("#")[0]).exists(), target


def test_the_operating_page_lists_every_label_of_every_metric() -> None:
    """docs/operating.md is written by hand: its metrics table must carry the code's labels."""
    from prometheus_client.metrics import MetricWrapperBase

    from rig_conductor.metrics import Metrics

    page = (REPO / "docs" / "operating.md").read_text()
    rows = {
        row[0].strip("` "): row[2]
        for line in page.splitlines()
        if line.startswith("| `rig_")
        for row in [line.strip("|").split("|")]
    }
    for metric in vars(Metrics()).values():
        if not isinstance(metric, MetricWrapperBase) or not metric._labelnames:
            continue
        name = metric._name + ("_total" if metric._type == "counter" else "")
        if name not in rows:
            continue  # the page lists the contract's metrics; the reference lists them all
        listed = {label.split("(")[0].strip() for label in rows[name].split(",")}
        assert set(metric._labelnames) <= listed, (name, rows[name])
