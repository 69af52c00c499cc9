"""Every package under src/ ships: pyproject lists them explicitly, migrations/ mapped in."""

from __future__ import annotations

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


def test_migrations_ship_as_a_subpackage() -> None:
    from importlib import resources

    scripts = resources.files("rig_conductor._migrations").joinpath("versions")
    assert any(p.name.startswith("0001_") for p in scripts.iterdir())
