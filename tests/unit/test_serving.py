"""The server stack `serve` runs on (`serving.config`): httptools and uvloop, named rather than
left to uvicorn's "auto". What the parser answers on the wire is in
tests/integration/test_serve_http.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rig_conductor import serving


async def app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("no request is made")


def test_serve_runs_on_httptools_and_uvloop() -> None:
    config = serving.config(app, host="127.0.0.1", port=0)
    assert isinstance(config.http, type) and issubclass(config.http, HttpToolsProtocol)
    if sys.platform == "win32":  # pragma: no cover - no uvloop there (pyproject's marker)
        assert config.loop == "asyncio"
        return
    import uvloop

    assert config.loop == "uvloop"
    loop = config.get_loop_factory()
    assert loop is not None
    made = loop()
    try:
        assert isinstance(made, uvloop.Loop)
    finally:
        made.close()


def test_without_uvloop_serve_falls_back_to_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert serving.config(app, host="127.0.0.1", port=0).loop == "asyncio"


def test_serves_behaviours_survive_an_override_of_the_stack() -> None:
    """A benchmark's other stack changes the protocol and the loop, nothing else."""
    config = serving.config(app, host="127.0.0.1", port=0, http="h11", loop="asyncio")
    assert (config.http, config.loop) == ("h11", "asyncio")
    assert config.proxy_headers is False
    assert config.log_config is None and config.access_log is False
    assert (config.lifespan, config.timeout_graceful_shutdown) == ("on", 30)
