"""Remove from an installed environment what the conductor never loads (run by the Dockerfile,
in the step that installs the wheels, so no layer keeps what it removes).

- The Kubernetes client: its asyncio copy (kubernetes.aio), every API group but the three the
  conductor calls (core/v1 for pods, coordination/v1 for the Lease, authentication/v1 for the
  agents' TokenReviews), and every model that no request or response of those calls can
  contain. The client loads APIs and models lazily by name, so what is left is all that can
  ever be imported; the models kept are the closure of those objects' `openapi_types`, so
  (de)serialisation finds every class it needs.
- SQLAlchemy's test suite (its dialects stay: alembic imports every one of them).

    python scripts/prune_image.py [site-packages]   # default: the running interpreter's
"""

from __future__ import annotations

import importlib
import re
import shutil
import sys
import sysconfig
from pathlib import Path

KEEP_APIS = {"core_v1_api", "coordination_v1_api", "authentication_v1_api"}
# What those calls send and answer (and the errors and watch events they carry).
RESPONSES = {
    "V1Pod",
    "V1PodList",
    "V1Lease",
    "V1LeaseList",
    "V1Status",
    "V1DeleteOptions",
    "V1TokenReview",
}
_TYPE_NAME = re.compile(r"[A-Z][A-Za-z0-9]+")
_BUILTIN = {"str", "int", "float", "bool", "date", "datetime", "object", "dict", "list"}


def model_closure(roots: set[str]) -> set[str]:
    """Every model class reachable from `roots` through their `openapi_types`."""
    models = importlib.import_module("kubernetes.client.models")
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name in _BUILTIN or not hasattr(models, name):
            continue  # a builtin or a typing name ("List", "Dict"), not a model
        seen.add(name)
        cls = getattr(models, name)
        for type_text in getattr(cls, "openapi_types", {}).values():
            todo += [t for t in _TYPE_NAME.findall(type_text) if t not in seen]
    return seen


def module_of(class_name: str) -> str:
    """kubernetes.client.models' file stem of a model class (`V1PodList` -> `v1_pod_list`)."""
    models = importlib.import_module("kubernetes.client.models")
    return str(getattr(models, class_name).__module__).rsplit(".", 1)[-1]


def remove(path: Path) -> int:
    """Delete a module or package and its bytecode; bytes freed."""
    freed = 0
    targets = [path] if path.exists() else []
    cache = path.parent / "__pycache__"
    if path.suffix == ".py" and cache.is_dir():
        targets += list(cache.glob(f"{path.stem}.*.pyc"))
    for target in targets:
        if target.is_dir():
            freed += sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
            shutil.rmtree(target)
        else:
            freed += target.stat().st_size
            target.unlink()
    return freed


def prune(site: Path) -> int:
    sys.path.insert(0, str(site))
    kubernetes = site / "kubernetes"
    freed = remove(kubernetes / "aio")
    for module in (kubernetes / "client" / "api").glob("*.py"):
        if module.stem != "__init__" and module.stem not in KEEP_APIS:
            freed += remove(module)
    # The kept API modules import some models at the top: those, and what they reach, stay too.
    imported: set[str] = set()
    for api in KEEP_APIS:
        text = (kubernetes / "client" / "api" / f"{api}.py").read_text()
        imported |= set(
            re.findall(r"^from kubernetes\.client\.models\.\w+ import (\w+)", text, re.M)
        )
    keep = {module_of(name) for name in model_closure(RESPONSES | imported)} | {"__init__"}
    for module in (kubernetes / "client" / "models").glob("*.py"):
        if module.stem not in keep:
            freed += remove(module)
    freed += remove(site / "sqlalchemy" / "testing")
    return freed


def main() -> int:
    site = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(sysconfig.get_paths()["purelib"])
    freed = prune(site)
    print(f"pruned {freed / 1e6:.1f} MB from {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
