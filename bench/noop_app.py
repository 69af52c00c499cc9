"""The no-op baseline of bench/ingest.py: POST /api/events parsed with the conductor's own model
and answered as the conductor does, storing nothing; served as `serve` is.

    .venv/bin/python bench/noop_app.py --port 8081
"""

from __future__ import annotations

import argparse
import socket
from typing import Annotated

import uvicorn
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from rig_conductor import gcpolicy, logs
from rig_conductor.api import schemas

app = FastAPI(title="rig-conductor bench no-op")


@app.post("/api/events", status_code=202, response_model=None)
async def post_event(event: Annotated[schemas.Event, Body()]) -> JSONResponse:
    return JSONResponse(schemas.Accepted().model_dump(by_alias=True), status_code=202)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


class Server(uvicorn.Server):
    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        gcpolicy.after_startup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8081)
    port = parser.parse_args().port
    logs.configure("text", "INFO")
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    Server(config).run()
