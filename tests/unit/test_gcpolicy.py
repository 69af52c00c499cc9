"""The collector settings `serve` applies once started."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys

import pytest

from rig_conductor import cli, gcpolicy


def _after_startup_in_a_fresh_process(threshold: tuple[int, int, int]) -> dict[str, object]:
    code = f"""
import gc, json
from rig_conductor import gcpolicy
gc.set_threshold(*{threshold!r})
gc.collect()
assert gc.get_freeze_count() == 0
gcpolicy.after_startup()
print(json.dumps({{"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_start_up_objects_are_frozen_and_the_young_threshold_raised() -> None:
    state = _after_startup_in_a_fresh_process((700, 10, 10))
    assert state["threshold"] == [gcpolicy.YOUNG_THRESHOLD, 10, 10]
    assert isinstance(state["frozen"], int) and state["frozen"] > 1_000  # the loaded modules


def test_a_higher_threshold_set_by_the_operator_is_kept() -> None:
    state = _after_startup_in_a_fresh_process((50_000, 20, 30))
    assert state["threshold"] == [50_000, 20, 30]


async def test_serve_applies_it_once_the_server_has_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn

    applied = asyncio.Event()
    started_then: list[bool] = []

    def after_startup() -> None:
        started_then.append(server.started)
        applied.set()

    monkeypatch.setattr(gcpolicy, "after_startup", after_startup)

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("no request is made")

    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_config=None)
    server = cli._server_class()(config)
    serving = asyncio.create_task(server.serve())
    try:
        await asyncio.wait_for(applied.wait(), 10)
        assert started_then == [True]  # once, with the sockets bound and the lifespan done
    finally:
        server.should_exit = True
        await serving


def test_a_pause_holds_until_the_last_of_overlapping_pauses_ends() -> None:
    assert gc.isenabled()
    first, second = gcpolicy.paused(), gcpolicy.paused()
    first.__enter__()
    assert not gc.isenabled()
    second.__enter__()
    first.__exit__(None, None, None)  # sweeps of two groups end out of order
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_switched_off_elsewhere_off() -> None:
    gc.disable()
    try:
        with gcpolicy.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ends_when_its_block_raises() -> None:
    with pytest.raises(RuntimeError), gcpolicy.paused():
        raise RuntimeError("the sweep failed")
    assert gc.isenabled()
