"""Refresh docs/img from the browser tests' screenshots ($RIG_ARTIFACTS_DIR/screenshots).

    .venv/bin/python scripts/docs_screenshots.py   # part of `make docs`

Every picture in docs/img is a screenshot a test in tests/browser takes, under the same file
name (tests/unit/test_docs_screenshots.py holds the docs to that). This copies each one the
last browser run left, and leaves the others as committed: the docs show the console as the
tests last saw it.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "img"


def main() -> int:
    taken = Path(os.environ.get("RIG_ARTIFACTS_DIR", REPO / ".artifacts")) / "screenshots"
    copied = []
    for image in sorted(IMAGES.glob("*.png")):
        shot = taken / image.name
        if shot.is_file():
            shutil.copyfile(shot, image)
            copied.append(image.name)
    where = taken if taken.is_dir() else f"{taken} (absent: run the browser tests)"
    print(f"docs/img: {len(copied)} screenshots refreshed from {where}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
