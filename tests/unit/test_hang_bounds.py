"""Each test's hang bound reaches its JUnit report, where `make flake` reads it."""

from __future__ import annotations

import pytest


@pytest.mark.timeout(77)
def test_a_tests_own_bound_is_in_its_report(request: pytest.FixtureRequest) -> None:
    assert ("hang_bound_s", 77.0) in request.node.user_properties


def test_without_a_mark_the_configured_bound_is(request: pytest.FixtureRequest) -> None:
    configured = float(request.config.getini("timeout"))
    assert configured > 0
    assert ("hang_bound_s", configured) in request.node.user_properties
