"""The baselines of bench/ingest.py, each on a server stack named on its command line:

- `noop`: a FastAPI app whose POST /api/events parses the body with the conductor's own model
  and answers as the conductor does, storing nothing;
- `floor`: a raw ASGI app (no FastAPI, no Starlette) that reads the body, parses it with
  `json.loads` and answers 202 `{"accepted": true}`: the least any Python ASGI app can do with
  a heartbeat on that server, the floor of what the conductor can reach.

The stack `httptools+uvloop` is `serve`'s own (`rig_conductor.serving.config`, unchanged);
another stack replaces its protocol and loop, nothing else.

    .venv/bin/python bench/noop_app.py --port 8081 [--app noop|floor] [--stack h11+asyncio]
"""

from __future__ import annotations

import argparse
import json
import socket
from typing import Annotated, Any

import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from rig_conductor import gcpolicy, logs, serving
from rig_conductor.api import schemas

# Server stack -> what it changes in serving.config (nothing: serve's own).
STACKS: dict[str, dict[str, str]] = {
    "httptools+uvloop": {},
    "h11+asyncio": {"http": "h11", "loop": "asyncio"},
}
SERVE_STACK = "httptools+uvloop"

app = FastAPI(title="rig-conductor bench no-op")


@app.post("/api/events", status_code=202, response_model=None)
async def post_event(event: Annotated[schemas.Event, Body()]) -> JSONResponse:
    return JSONResponse(schemas.Accepted().model_dump(by_alias=True), status_code=202)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


_ACCEPTED = json.dumps(schemas.Accepted().model_dump(by_alias=True)).encode()
_JSON = [(b"content-type", b"application/json")]


async def floor(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    if scope["path"] == "/healthz":
        status, body = 200, b'{"status":"ok"}'
    else:
        event = json.loads(b"".join(chunks))
        status, body = (202, _ACCEPTED) if event.get("type") == "HEARTBEAT" else (422, b"{}")
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        gcpolicy.after_startup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--app", choices=("noop", "floor"), default="noop")
    parser.add_argument("--stack", choices=sorted(STACKS), default=SERVE_STACK)
    args = parser.parse_args()
    logs.configure("text", "INFO")
    served = app if args.app == "noop" else floor
    config = serving.config(served, host="127.0.0.1", port=args.port, **STACKS[args.stack])
    Server(config).run()
