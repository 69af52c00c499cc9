"""Stream names a client sends the console: only the streams the settings cover (the dispatch
stream, RIG_STREAMS names, and names its patterns match); a pattern would make the page SCAN
the keyspace, and is a 400 page instead."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from rig_conductor.settings import Settings

from .console_kit import OPERATOR, builder, client_of, sign_in
from .helpers import fill, read

PATTERNS = ("rig:dispatch", "assignments:*")


@pytest.fixture
async def console(
    make_settings: Callable[..., Settings], redis: Redis, engine: AsyncEngine
) -> AsyncIterator[httpx.AsyncClient]:
    async for client in client_of(builder(make_settings)(streams=PATTERNS)):
        yield client


@pytest.mark.parametrize(
    "stream", ["*", "assignments:*", "rig:*", "other", "assignments:a:dlq", "a\\*", "[a-z]*"]
)
async def test_a_stream_the_settings_do_not_cover_is_a_400_page(
    console: httpx.AsyncClient, redis: Redis, stream: str
) -> None:
    await fill(redis, "other", "workers", 1)  # exists, but RIG_STREAMS does not name it
    csrf = await sign_in(console, OPERATOR)
    answers = [
        await console.get("/ui/group", params={"stream": stream, "name": "workers"}),
        await console.get(
            "/ui/pending", params={"stream": stream, "group": "workers", "consumer": "c"}
        ),
        await console.get("/ui/deadletters", params={"stream": stream}),
        await console.post(
            "/ui/deadletters/delete",
            data={"csrf": csrf, "stream": stream, "all_matching": "true"},
        ),
        await console.post(
            "/ui/move",
            data={
                "csrf": csrf,
                "stream": stream,
                "group": "workers",
                "consumer": "c",
                "target": "d",
                "entries": ["1-1"],
            },
        ),
    ]
    for answer in answers:
        assert answer.status_code == 400, (answer.request.url, answer.text)
        assert "is not a stream of RIG_DISPATCH_STREAM or RIG_STREAMS" in answer.text


@pytest.mark.parametrize("stream", ["assignments:a\nb", "assignments:\x1b[2J", "rig:dispatch\r"])
async def test_a_stream_name_with_control_characters_is_a_400_page(
    console: httpx.AsyncClient, stream: str
) -> None:
    """Even where a pattern of RIG_STREAMS would match it."""
    await sign_in(console, OPERATOR)
    for path in ("/ui/deadletters", "/ui/group"):
        answer = await console.get(path, params={"stream": stream, "name": "workers"})
        assert answer.status_code == 400 and "control characters" in answer.text


async def test_streams_the_settings_cover_are_shown(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    for stream in ("rig:dispatch", "assignments:dev-e"):
        await fill(redis, stream, "workers", 2)
        held = await read(redis, stream, "workers", "dev-e-0", 2)
        await sign_in(console, OPERATOR)
        page = await console.get(
            "/ui/pending", params={"stream": stream, "group": "workers", "consumer": "dev-e-0"}
        )
        assert page.status_code == 200 and held[0] in page.text
        letters = await console.get("/ui/deadletters", params={"stream": stream})
        assert letters.status_code == 200
