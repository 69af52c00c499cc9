"""The architecture diagram names real parts: each box that names a package (`api/`) names one
of src/rig_conductor/, every package has its box, and the other boxes are the outside world
the settings reach (Redis, PostgreSQL, Kubernetes) or the people and tools around it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "rig_conductor"
PAGES = [REPO / "README.md", REPO / "docs" / "index.md"]
DIAGRAM = re.compile(r"^```mermaid\n(.*?)^```", re.MULTILINE | re.DOTALL)
# `id["label"]`, `id[(label)]`, `id([label])`, `id[[label]]`: a node and its label.
NODE = re.compile(r"\b([A-Za-z_]\w*)(?:\[\[|\[\(|\(\[|\[)\"?([^\]\)\"]+)")
OUTSIDE = {"dispatcher", "operator", "redis", "postgres", "kubernetes", "prometheus"}


def packages() -> set[str]:
    return {path.parent.name for path in PACKAGE.glob("*/__init__.py")}


def nodes(page: Path) -> dict[str, str]:
    [diagram] = DIAGRAM.findall(page.read_text())
    return dict(NODE.findall(diagram))


def test_every_box_names_a_real_package_or_the_outside_world() -> None:
    real = packages()
    for page in PAGES:
        for node, label in nodes(page).items():
            if node in ("pods", "conductor"):  # the subgraphs: where things run
                continue
            named = re.match(r"(\w+)/:", label)
            if named:
                assert named[1] in real, f"{page.name}: box {node} names {named[1]}/, not a package"
                assert node == named[1], f"{page.name}: box {node} is labelled {label}"
            else:
                assert node in OUTSIDE, f"{page.name}: box {node} ({label}) is no known part"


def test_every_package_has_its_box() -> None:
    for page in PAGES:
        drawn = {node for node, label in nodes(page).items() if label.startswith(f"{node}/")}
        assert drawn == packages(), f"{page.name}: packages without a box: {packages() - drawn}"


def test_the_site_and_the_front_page_draw_the_same_picture() -> None:
    readme, index = (DIAGRAM.findall(page.read_text()) for page in PAGES)
    assert readme == index
