"""The release's version, read from its one place (`__version__` in src/rig_conductor/__init__.py),
and every other place that must say the same.

    python3 scripts/version.py            # prints the version (make release, build-image.sh)
    python3 scripts/version.py --check    # every place and what it says; exit 1 on a mismatch

Standard library only: it runs before anything is installed. The wheel takes its version from the
same assignment (pyproject: `dynamic = ["version"]`); tests/unit/test_version.py runs the check.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "src" / "rig_conductor" / "__init__.py"
CHART = REPO / "charts" / "rig-conductor" / "Chart.yaml"
NPM = REPO / "clients" / "typescript" / "package.json"
# The image labels take VERSION from the build argument; the default is what a plain
# `docker build .` labels the image with.
DOCKERFILES = (REPO / "Dockerfile", REPO / "Dockerfile.audit")
_ASSIGNED = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)


def version() -> str:
    """The one version: the `__version__` assignment, read without importing the package."""
    found = _ASSIGNED.search(SOURCE.read_text())
    if found is None:
        raise SystemExit(f'{SOURCE.relative_to(REPO)}: no `__version__ = "..."` line')
    return found.group(1)


def _yaml_field(path: Path, field: str) -> str | None:
    found = re.search(rf'^{field}:\s*"?([^"\s]+)"?\s*$', path.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def _dockerfile_default(path: Path) -> str | None:
    found = re.search(r"^ARG VERSION=(\S+)$", path.read_text(), re.MULTILINE)
    return found.group(1) if found else None


def places() -> dict[str, str | None]:
    """What each place says the version is (None: the place names none)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    dynamic = project["tool"]["setuptools"].get("dynamic", {}).get("version", {})
    said: dict[str, str | None] = {
        "pyproject.toml [project] version": project["project"].get("version"),
        "pyproject.toml version attr": (
            version() if dynamic.get("attr") == "rig_conductor.__version__" else None
        ),
        "Chart.yaml version": _yaml_field(CHART, "version"),
        "Chart.yaml appVersion": _yaml_field(CHART, "appVersion"),
    }
    for dockerfile in DOCKERFILES:
        if dockerfile.exists():
            said[f"{dockerfile.name} ARG VERSION"] = _dockerfile_default(dockerfile)
    if NPM.exists():
        said["clients/typescript/package.json"] = json.loads(NPM.read_text()).get("version")
    return said


def mismatches() -> list[str]:
    """Every place that does not say the one version, as `place: what it says`."""
    want = version()
    wrong = []
    for place, said in places().items():
        # pyproject must not carry a static version of its own: it reads the attribute.
        expected = None if place == "pyproject.toml [project] version" else want
        if said != expected:
            wrong.append(f"{place}: {said!r} (want {expected!r})")
    return wrong


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        wrong = mismatches()
        for line in wrong:
            print(line, file=sys.stderr)
        print(f"{version()}: {'mismatch' if wrong else 'every place agrees'}")
        return 1 if wrong else 0
    if argv[1:]:
        print("usage: scripts/version.py [--check]", file=sys.stderr)
        return 2
    print(version())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
