"""RIG_API_TOKEN_FILE: the token follows the file as the kubelet rotates it, and a refused token
makes the conductor client read the file again (httpx's MockTransport as the conductor)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from rig_conductor.agent.conductor import ConductorClient, ConductorRejected
from rig_conductor.agent.token_file import TokenFile, TokenFileError, read_token
from tests.projected_token import projected


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_token_is_stripped_and_follows_a_symlink_swap(tmp_path: Path) -> None:
    path = projected(tmp_path, "first.jwt.token\n", 1)
    tokens = TokenFile(path)
    assert tokens.current() == "first.jwt.token"

    projected(tmp_path, " second.jwt.token ", 2)
    assert tokens.current() == "second.jwt.token"


def test_a_file_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-token")
    tokens = TokenFile(path)
    path.write_text("second-token-longer")  # another size
    assert tokens.current() == "second-token-longer"


def test_a_token_file_that_breaks_keeps_the_previous_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first-token")
    tokens = TokenFile(path)
    path.write_text("")
    assert tokens.current() == "first-token"
    path.unlink()
    assert tokens.current() == "first-token"
    path.write_text("third-token")
    assert tokens.current() == "third-token"


def test_read_token_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError, match=f"cannot read {tmp_path / 'none'}"):
        read_token(tmp_path / "none")
    (tmp_path / "blank").write_text(" \n")
    with pytest.raises(TokenFileError, match="is empty"):
        read_token(tmp_path / "blank")


def unchanged_stat_rewrite(path: Path, token: str) -> None:
    """Replace the content, keeping inode, size and mtime: only a 401 can reveal it."""
    before = path.stat()
    assert len(token) == before.st_size
    with path.open("r+") as file:
        file.write(token)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


async def test_a_401_reads_the_file_again_and_tries_once_more(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old-token-aaaa")
    clock = Clock()
    tokens = TokenFile(path, clock=clock)
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        if request.headers["authorization"] != "Bearer new-token-bbbb":
            return httpx.Response(401, json={"detail": "invalid token"})
        return httpx.Response(202, json={"accepted": True})

    api = ConductorClient(
        base_url="http://conductor",
        agent_id="dev-e",
        consumer="dev-e-0",
        token_file=tokens,
        transport=httpx.MockTransport(handle),
    )
    try:
        unchanged_stat_rewrite(path, "new-token-bbbb")
        clock.now += 1  # read a moment ago: a refusal does not read it again yet
        with pytest.raises(ConductorRejected, match="401"):
            await api.heartbeat()
        assert seen == ["Bearer old-token-aaaa"]

        clock.now += 5
        await api.heartbeat()
        assert seen[1:] == ["Bearer old-token-aaaa", "Bearer new-token-bbbb"]
        await api.heartbeat()  # and from now on the new one, at once
        assert seen[3:] == ["Bearer new-token-bbbb"]
    finally:
        await api.aclose()


async def test_a_fixed_token_and_a_file_are_not_both_taken(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("a-token")
    with pytest.raises(ValueError, match="not both"):
        ConductorClient(
            base_url="http://conductor",
            agent_id="a",
            consumer="a-0",
            token="b-token",
            token_file=TokenFile(path),
        )


async def test_each_request_carries_the_files_current_token(tmp_path: Path) -> None:
    path = projected(tmp_path, "first.jwt.token", 1)
    bodies: list[tuple[str, dict[str, object]]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append((request.headers["authorization"], json.loads(request.content)))
        return httpx.Response(202, json={"accepted": True})

    api = ConductorClient(
        base_url="http://conductor",
        agent_id="dev-e",
        consumer="dev-e-0",
        token_file=TokenFile(path),
        transport=httpx.MockTransport(handle),
    )
    try:
        await api.heartbeat()
        projected(tmp_path, "second.jwt.token", 2)
        await api.heartbeat()
    finally:
        await api.aclose()
    assert [auth for auth, _ in bodies] == ["Bearer first.jwt.token", "Bearer second.jwt.token"]
    assert all(body["type"] == "HEARTBEAT" for _, body in bodies)
