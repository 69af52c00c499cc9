"""The glossary defines the words the docs, the logs and the code use in a sense of their own,
and the site lists it: a word on this list that loses its entry fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GLOSSARY = REPO / "docs" / "glossary.md"
WORDS = (
    "blind spell",
    "heard",
    "worn out",
    "heartbeat lane",
    "degraded-stale",
    "stalled",
    "attempt",
    "fencing",
    "staged outputs",
    "epoch",
    "idle-guarded",
    "dead letter",
    "reclaim",
    "tenant",
    "lease",
)


def entries() -> set[str]:
    """The words the glossary defines: each bold lead of an entry, split at commas."""
    text = GLOSSARY.read_text()
    return {
        word.strip().lower()
        for lead in re.findall(r"^\*\*([^*]+?)\.?\*\*", text, re.MULTILINE)
        for word in lead.split(",")
    }


@pytest.mark.parametrize("word", WORDS)
def test_the_glossary_defines(word: str) -> None:
    assert word in entries(), f"docs/glossary.md has no entry for {word!r}"


def test_the_site_lists_the_glossary() -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert {"Glossary": "glossary.md"} in config["nav"]
