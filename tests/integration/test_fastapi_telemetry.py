"""FastAPI's own OpenTelemetry (`app.fastapi_telemetry`): without an OpenTelemetry SDK there is
no provider it could report to, and a request no longer looks for one; with an SDK installed it
is as FastAPI sets it up."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any

import pytest
from fastapi import FastAPI
from opentelemetry import trace

from rig_conductor.app import fastapi_telemetry

from .console_kit import AGENT, client_of


def _count_provider_lookups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Each call of `trace.get_tracer_provider`, FastAPI's per-request check, counted."""
    calls: list[int] = []
    real = trace.get_tracer_provider

    def counted() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(trace, "get_tracer_provider", counted)
    return calls


async def _heartbeats(app: FastAPI, count: int) -> None:
    async for client in client_of(app):
        for n in range(count):
            answer = await client.post(
                "/api/events",
                json={"type": "HEARTBEAT", "agentId": "dev-e", "consumer": f"dev-e-{n}"},
                headers={"Authorization": f"Bearer {AGENT}"},
            )
            assert answer.status_code == 202, answer.text


async def test_without_an_sdk_no_request_looks_for_a_provider(
    build: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert importlib.util.find_spec("opentelemetry.sdk") is None  # as the image ships
    lookups = _count_provider_lookups(monkeypatch)
    await _heartbeats(build(), 3)
    assert lookups == []


async def test_with_an_sdk_fastapi_keeps_its_telemetry(
    build: Callable[..., FastAPI], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_find_spec = importlib.util.find_spec

    def with_sdk(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "opentelemetry.sdk":
            return ModuleSpec(name, loader=None)
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", with_sdk)
    app = build()
    monkeypatch.undo()
    lookups = _count_provider_lookups(monkeypatch)
    await _heartbeats(app, 3)
    assert len(lookups) >= 3  # FastAPI checks for a configured provider on every request


def test_a_fastapi_without_its_own_telemetry_is_given_no_such_argument(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyproject allows a FastAPI older than its telemetry, whose constructor would refuse it."""
    real_find_spec = importlib.util.find_spec

    def before_telemetry(name: str, package: str | None = None) -> ModuleSpec | None:
        if name == "fastapi.telemetry":
            return None
        return real_find_spec(name, package)

    assert "telemetry" in fastapi_telemetry()  # this environment: FastAPI 0.165, no SDK
    monkeypatch.setattr(importlib.util, "find_spec", before_telemetry)
    assert fastapi_telemetry() == {}
