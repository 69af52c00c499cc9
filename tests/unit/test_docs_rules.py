"""docs/rules.md cannot drift: every function it names imports, every test it names exists, and
every reaper rule has its section.

The page names code as dotted paths (`rig_conductor.policy.reclaim.assess_group`: a module,
then attributes) and tests as pytest node ids (`tests/unit/test_x.py::test_y`)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "rules.md"
SPAN = re.compile(r"`([^`\n]+)`")
CODE = re.compile(r"rig_conductor(?:\.\w+)+")
TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
RULES = ("1", "2", "3", "3b", "4", "4b", "5", "6", "7", "8", "9")


def spans() -> list[str]:
    return SPAN.findall(PAGE.read_text())


def code_names() -> list[str]:
    return sorted({span for span in spans() if CODE.fullmatch(span)})


def named_tests() -> list[str]:
    return sorted({span for span in spans() if TEST.fullmatch(span)})


def resolve(dotted: str) -> object:
    """Import the longest module prefix of `dotted`, then follow the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def defined_tests(path: Path) -> set[str]:
    """Test functions of a file, at module level or in a class."""
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_the_page_names_code_and_tests() -> None:
    assert len(code_names()) > 20
    assert len(named_tests()) > 40


@pytest.mark.parametrize("dotted", code_names())
def test_every_function_the_page_names_exists(dotted: str) -> None:
    resolve(dotted)


@pytest.mark.parametrize("nodeid", named_tests())
def test_every_test_the_page_names_exists(nodeid: str) -> None:
    match = TEST.fullmatch(nodeid)
    assert match is not None
    path, name = REPO / match[1], match[2]
    assert path.is_file(), f"{match[1]} is gone"
    assert name in defined_tests(path), f"{match[1]} has no {name}"


def test_every_rule_has_a_section() -> None:
    headings = re.findall(r"^## Rule (\w+):", PAGE.read_text(), re.MULTILINE)
    assert tuple(headings) == RULES


# "rule 5", "Rule 3b", "rules 3 and 4b", "reaper rule 6": a citation of the page in code.
CITED = re.compile(r"\b[Rr]ules? (\d+b?)\b((?:(?:, | and | or )\d+b?\b)*)")


def citations(text: str) -> set[str]:
    cited: set[str] = set()
    for match in CITED.finditer(text):
        cited.add(match[1])
        cited.update(re.findall(r"\d+b?", match[2]))
    return cited


def test_citations_are_read_as_written() -> None:
    assert citations("rule 5, docs/rules.md") == {"5"}
    assert citations("Rules 3 and 4b decide; rule 7 too") == {"3", "4b", "7"}
    assert citations("no rule here, 5 rules, ruled 3") == set()


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(REPO)) for p in (REPO / "src").rglob("*.py") if citations(p.read_text())
    ),
)
def test_code_that_cites_a_rule_points_at_the_page(path: str) -> None:
    """Every source file naming a reaper rule names the page that holds it, and only rules the
    page has: a citation never points to a contract the repository does not contain."""
    text = (REPO / path).read_text()
    assert "docs/rules.md" in text, f"{path} cites a rule but not docs/rules.md"
    unknown = citations(text) - set(RULES)
    assert not unknown, f"{path} cites rules the page does not have: {sorted(unknown)}"
