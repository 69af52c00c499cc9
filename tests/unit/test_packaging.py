"""Every package under src/ ships: pyproject lists them explicitly, migrations/ mapped in."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(ROOT / "src").parts)
        for init in (ROOT / "src").rglob("__init__.py")
    }
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"


def test_every_data_file_under_src_is_package_data() -> None:
    """A template or asset that no package-data pattern names is left out of the wheel: the
    console's pages, the audit's report.html."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    src = ROOT / "src"
    shipped = {
        path
        for package, patterns in config["tool"]["setuptools"]["package-data"].items()
        for pattern in patterns
        for path in (src / package.replace(".", "/")).glob(pattern)
    }
    data = {
        path
        for path in (src / "rig_conductor").rglob("*")
        if path.is_file()
        and path.suffix not in (".py", ".pyc")
        and not {"__pycache__", "_migrations"} & set(path.relative_to(src).parts)
    }
    assert data <= shipped, f"add to package-data: {sorted(map(str, data - shipped))}"


def test_migrations_ship_as_a_subpackage() -> None:
    from importlib import resources

    scripts = resources.files("rig_conductor._migrations").joinpath("versions")
    assert any(p.name.startswith("0001_") for p in scripts.iterdir())


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string ("redis[hiredis]>=5" -> redis)."""
    head = re.split(r"[\[<>=!~;\s]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", head).lower()


def test_every_dependency_is_pinned_in_the_constraints() -> None:
    """The image, CI and a release install the versions in constraints.txt: a dependency added
    to pyproject without `make lock` would float."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    for requirements in project["optional-dependencies"].values():
        wanted |= {_name(r) for r in requirements if not r.startswith("rig-conductor")}
    pinned = {
        _name(line.split("==")[0])
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert wanted <= pinned, f"run `make lock`: not in constraints.txt: {sorted(wanted - pinned)}"
