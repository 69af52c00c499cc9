"""Stream entry ids from clients, over HTTP: an id Redis would refuse is the client's mistake
(422 from the API, a 400 page from the console), never a 5xx; and a Redis error reply caused by
what the request named is not "Redis is unavailable"."""

from __future__ import annotations

import httpx
import pytest
from redis.asyncio import Redis

from .console_kit import OPERATOR, G, S, sign_in, stuck

# The fuzzer's find: the pattern matches, but both parts exceed 2^64-1.
OVER = "62897778110416964515-160485"
BAD_IDS = [OVER, f"{2**64}-0", f"0-{2**64}", "\u0661-1", "1-1\n", "nope"]
BEARER = {"Authorization": f"Bearer {OPERATOR}"}


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_the_api_answers_422_to_an_id_redis_would_refuse(
    console: httpx.AsyncClient, redis: Redis, bad: str
) -> None:
    await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
    delete = await console.delete(
        "/api/deadletters", params={"stream": S, "dlqId": bad}, headers=BEARER
    )
    assert delete.status_code == 422, delete.text
    assert delete.json()["errors"][0]["field"] == "query.dlqId"
    requeue = await console.post(
        "/api/deadletters/requeue", json={"stream": S, "dlqId": bad}, headers=BEARER
    )
    assert requeue.status_code == 422 and requeue.json()["errors"][0]["field"] == "dlqId"
    work = await console.post(
        "/api/events",
        json={"type": "WORK_STARTED", "agentId": "dev-e", "stream": S, "entryId": bad},
        headers=BEARER,
    )
    assert work.status_code == 422 and work.json()["errors"][0]["field"] == "entryId"
    assert await redis.xlen(f"{S}:dlq") == 1


async def test_the_largest_id_redis_takes_is_accepted(console: httpx.AsyncClient) -> None:
    top = f"{2**64 - 1}-{2**64 - 1}"
    answer = await console.delete(
        "/api/deadletters", params={"stream": S, "dlqId": top}, headers=BEARER
    )
    assert answer.status_code == 404  # a well-formed id of no dead letter


async def test_a_redis_refusal_caused_by_the_request_is_not_an_outage(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await redis.set(f"{S}:dlq", "not a stream")
    answer = await console.get("/api/deadletters", params={"stream": S}, headers=BEARER)
    assert answer.status_code == 422, answer.text
    assert "unavailable" not in answer.text and "WRONGTYPE" in answer.json()["detail"]
    assert "retry-after" not in answer.headers


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_the_console_answers_a_400_page_to_a_bad_id(
    console: httpx.AsyncClient, redis: Redis, bad: str
) -> None:
    held = await stuck(redis, console, 2)
    csrf = await sign_in(console, OPERATOR)
    await redis.xadd(f"{S}:dlq", {"originalId": "1-1", "reason": "max-deliveries"})
    answers = [
        await console.get(
            "/ui/pending", params={"stream": S, "group": G, "consumer": "dev-e-0", "after": bad}
        ),
        await console.get("/ui/deadletters", params={"before": bad}),
        await console.post(
            "/ui/deadletters/requeue", data={"csrf": csrf, "stream": S, "ids": [bad]}
        ),
        await console.post("/ui/deadletters/delete", data={"csrf": csrf, "stream": S, "one": bad}),
        await console.post(
            "/ui/move",
            data={
                "csrf": csrf,
                "stream": S,
                "group": G,
                "consumer": "dev-e-0",
                "target": "qa-e-0",
                "entries": [held[0], bad],
            },
        ),
    ]
    for answer in answers:
        assert answer.status_code == 400, (answer.request.url, answer.text)
        assert answer.headers["content-type"].startswith("text/html")
        assert "Bad request" in answer.text and "Content-Security-Policy" in answer.headers
        assert "\n" not in bad or bad not in answer.text
    assert await redis.xlen(f"{S}:dlq") == 1


async def test_a_console_move_never_echoes_its_input_unescaped(
    console: httpx.AsyncClient, redis: Redis
) -> None:
    await stuck(redis, console, 1)
    csrf = await sign_in(console, OPERATOR)
    evil = "<script>alert(1)</script>"
    answer = await console.post(
        "/ui/move",
        data={
            "csrf": csrf,
            "stream": S,
            "group": G,
            "consumer": "dev-e-0",
            "target": "qa-e-0",
            "entries": [evil],
        },
    )
    assert answer.status_code == 400 and "Bad request: entries.0" in answer.text
    assert evil not in answer.text
