"""The no-op baseline for bench/ingest.py: POST /api/events parsed with the conductor's own model.

    .venv/bin/python bench/noop_app.py --host 127.0.0.1 --port 8081
    .venv/bin/uvicorn --app-dir bench noop_app:app --port 8081 --no-access-log --log-level warning

The route takes the same `rig_conductor.api.schemas.Event` union as `POST /api/events` in
`rig_conductor.api.routes.events` (so a HEARTBEAT body goes through the same discriminated-union
validation) and answers `202 {"accepted": true}` built the same way, without storing anything.
It has none of the conductor's middleware (body limit, token check, error handlers): the
difference between the two endpoints is everything the conductor does beyond parsing the body.

Run as a script it starts uvicorn with the settings `rig-conductor serve` uses: one worker, the
default event loop and HTTP implementation, no access log, `log_config=None` with the
`rig_conductor.logs` dictConfig (text, INFO, stderr), and the collector tuned the same way once
started (`rig_conductor.gcpolicy`).
"""

from __future__ import annotations

import argparse
import socket
from typing import Annotated

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse

from rig_conductor.api import schemas

app = FastAPI(title="rig-conductor bench no-op")


@app.post("/api/events", status_code=202, response_model=None)
async def post_event(event: Annotated[schemas.Event, Body()]) -> JSONResponse:
    return JSONResponse(schemas.Accepted().model_dump(by_alias=True), status_code=202)


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


def main() -> int:
    import uvicorn

    from rig_conductor import gcpolicy, logs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--log-level", default="INFO", help="root log level (serve uses INFO)")
    args = parser.parse_args()
    logs.configure("text", args.log_level.upper())

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            gcpolicy.after_startup()

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=30,
    )
    Server(config).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
