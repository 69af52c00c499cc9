"""Logging set-up: one dictConfig builder, text or JSON lines on stderr.

In JSON format every record is one object whose `message` is the same sentence the text format
prints, with the `extra` fields a call passed (entryId, stream, fromConsumer, ...) beside it.
"""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def config(log_format: str = "text", level: str = "INFO") -> dict[str, Any]:
    """The dictConfig for `log_format` ("text" or "json"): everything to stderr."""
    formatters: dict[str, Any] = {
        "text": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
        "json": {"()": JsonFormatter},
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {log_format: formatters[log_format]},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": log_format,
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            # Per-request lines belong to the API's own access log, not uvicorn's.
            "uvicorn.access": {"level": "WARNING"},
            "httpx": {"level": "WARNING"},
            # The embedded PostgreSQL narrates every command it runs.
            "pgserver": {"level": "WARNING"},
            # One line per job run and per migration plugin: noise at INFO.
            "apscheduler": {"level": "WARNING"},
            "alembic.runtime.plugins": {"level": "WARNING"},
        },
    }


def configure(log_format: str = "text", level: str = "INFO") -> None:
    logging.config.dictConfig(config(log_format, level))
