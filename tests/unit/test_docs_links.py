"""Every relative link in README.md, the chart's README and docs/ leads somewhere: the file
exists and, when the link names an anchor, the page has a heading (or an element id) of that
name. Headings are turned into anchors as the MkDocs site does (Python-Markdown's toc slugify),
which matches GitHub's for the headings these pages use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    REPO / "README.md",
    REPO / "charts" / "rig-conductor" / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXPLICIT = re.compile(r"""\bid=["']([^"']+)["']|\{#([\w-]+)\}""")


def prose(page: Path) -> str:
    """The page without code blocks and code spans: links there are examples, not links."""
    return CODE.sub("", FENCE.sub("", page.read_text()))


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    found: set[str] = set()
    for heading in HEADING.findall(text):
        heading = re.sub(r"\{#[\w-]+\}$", "", heading).strip()
        plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = slugify(plain, "-")
        unique, n = slug, 0
        while unique in found:  # Python-Markdown numbers a repeated heading: x, x_1, x_2
            n += 1
            unique = f"{slug}_{n}"
        found.add(unique)
    for one, other in EXPLICIT.findall(text):
        found.add(one or other)
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{target}: no heading #{anchor} in {goal.relative_to(REPO)}")
    assert broken == [], f"{page.relative_to(REPO)}: {broken}"


def test_the_checker_sees_links_and_anchors() -> None:
    readme = links(REPO / "README.md")
    assert "docs/index.md" in readme or any(t.startswith("docs/") for t in readme)
    assert "connecting-to-your-redis" in anchors(REPO / "docs" / "deploying.md")
