"""The pictures in the docs cannot drift from the console: every image in docs/img is a
screenshot a browser test takes (same file name; `make docs` copies the last run's), every
image is shown somewhere, and every image a page shows exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "docs" / "img"
# A browser test's screenshot: `page.screenshot(path=screenshots / "name.png", ...)`.
TAKEN = re.compile(r'screenshots\s*/\s*"([^"]+\.png)"')
SHOWN = re.compile(r"!\[[^\]]*\]\(([^)\s]+)")


def taken_by_browser_tests() -> set[str]:
    return {
        name
        for test in (REPO / "tests" / "browser").glob("test_*.py")
        for name in TAKEN.findall(test.read_text())
    }


def shown() -> dict[str, list[str]]:
    """Image file -> the pages showing it (paths resolved from each page)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found: dict[str, list[str]] = {}
    for page in pages:
        for target in SHOWN.findall(page.read_text()):
            if "://" in target:
                continue
            image = (page.parent / target).resolve()
            found.setdefault(str(image.relative_to(REPO)), []).append(str(page.relative_to(REPO)))
    return found


def test_every_image_in_docs_img_is_a_browser_tests_screenshot() -> None:
    taken = taken_by_browser_tests()
    assert taken, "no screenshot found in tests/browser"
    for image in sorted(IMAGES.iterdir()):
        assert image.name in taken, (
            f"docs/img/{image.name} is no screenshot of tests/browser: take it there "
            f'(`screenshots / "{image.name}"`) so `make docs` keeps it current'
        )


def test_every_image_in_docs_img_is_shown_and_every_shown_image_exists() -> None:
    pictures = shown()
    for image in sorted(IMAGES.iterdir()):
        assert f"docs/img/{image.name}" in pictures, f"docs/img/{image.name} is shown nowhere"
    for image, pages in pictures.items():
        assert (REPO / image).is_file(), f"{pages} show {image}, which does not exist"
        assert image.startswith("docs/img/"), f"{pages} show {image}, outside docs/img"
