"""The no-op baseline of bench/ingest.py: POST /api/events parsed with the conductor's own model.

    .venv/bin/python bench/noop_app.py --port 8081

The route takes the conductor's `schemas.Event` union and answers `202 {"accepted": true}` as
the conductor does, storing nothing, with none of its middleware: the difference between the
two endpoints is everything the conductor does beyond parsing the body. Served as `serve` is:
one uvicorn worker, no access log, the `rig_conductor.logs` configuration, the gc policy.
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
