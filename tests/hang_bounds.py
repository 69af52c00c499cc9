"""Each test's hang bound (pytest-timeout's limit) in its JUnit report, as the property
`hang_bound_s`, so `make flake` can name the tests that come near theirs on a loaded machine
before one fails there (docs/development.md)."""

from __future__ import annotations

import pytest


def hang_bound_s(item: pytest.Item) -> float:
    """The test's own `pytest.mark.timeout`, else the `timeout` of pyproject.toml."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    if marker is not None and "timeout" in marker.kwargs:
        return float(marker.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.user_properties.append(("hang_bound_s", hang_bound_s(item)))
