"""`rig-conductor agent`: the reference worker's command line.

Operator mistakes (a bad RIG_* value, a bad --handler, a consumer name in use) end with one
line on stderr and exit 2, never a traceback. Runs until SIGTERM/SIGINT, then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("rig_conductor.agent")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_START_ID = re.compile(r"^(\$|\d+(-\d+)?)$")


class HandlerError(Exception):
    """A --handler that cannot be used; the message is one line."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `agent` on the `rig-conductor` subcommands (an argparse subparsers object)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "agent",
        help="reference worker: read a stream's consumer group and run a handler per entry",
        description="Reads a Redis Streams consumer group and runs a handler per entry, "
        "reporting WORK_* events to the conductor.",
    )
    add_arguments(parser)
    parser.set_defaults(command=_command)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agent-id", required=True, help="agent id sent with heartbeats")
    parser.add_argument("--group", required=True, help="consumer group to read in")
    parser.add_argument(
        "--stream", default=None, help="stream to read (default: RIG_DISPATCH_STREAM)"
    )
    parser.add_argument(
        "--start-id",
        default="0",
        type=_start_id,
        help="where a newly created group starts: 0 (default), $ or an entry id",
    )
    parser.add_argument(
        "--handler",
        required=True,
        metavar="MODULE:FUNC",
        help="handler called with each entry, e.g. mypkg.work:handle",
    )


def _start_id(value: str) -> str:
    if not _START_ID.match(value):
        raise argparse.ArgumentTypeError("must be 0, $ or a stream entry id like 1700000000000-0")
    return value


def _command(args: argparse.Namespace, settings: object) -> int:
    """The `command` hook of the top-level CLI; it has configured logging already."""
    return main(args)


def load_handler(spec: str) -> Callable[..., Any]:
    """`pkg.module:func` (or `pkg.module:Class.method`) -> the callable. Raises HandlerError."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name.strip() or not attribute.strip():
        raise HandlerError(f"--handler {spec!r}: expected the form pkg.module:func")
    if os.getcwd() not in sys.path:  # as `python -m` does: handlers may live in the work dir
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerError(
            f"--handler {spec!r}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerError(f"--handler {spec!r}: {module_name} has no {attribute}") from None
    if not callable(target):
        raise HandlerError(f"--handler {spec!r}: {attribute} is not callable")
    handler: Callable[..., Any] = target
    return handler


def main(args: argparse.Namespace, *, configure_logging: bool = False) -> int:
    """Run the agent for parsed `agent` arguments; returns the exit code."""
    from redis.exceptions import RedisError

    from rig_conductor import logs
    from rig_conductor.agent import lease, process, token_file
    from rig_conductor.agent.settings import load_agent_settings
    from rig_conductor.settings_base import SettingsError

    try:
        settings = load_agent_settings()
    except SettingsError as exc:
        print(f"rig-conductor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if configure_logging:
        logs.configure(settings.log_format)
    try:
        handler = load_handler(args.handler)
    except HandlerError as exc:
        print(f"rig-conductor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stream = args.stream or settings.dispatch_stream
    logger.info(
        "rig-conductor agent %s: stream %s, group %s, handler %s, effective configuration: %s",
        args.agent_id,
        stream,
        args.group,
        args.handler,
        json.dumps(settings.describe(), default=str),
    )
    try:
        asyncio.run(
            process.run_agent(
                handler,
                agent_id=args.agent_id,
                group=args.group,
                settings=settings,
                stream=stream,
                start_id=args.start_id,
                handle_signals=True,
            )
        )
    except (lease.ConsumerInUse, process.MissingPermission) as exc:
        logger.error("Refusing to start: %s", exc)
        return EXIT_USAGE
    except token_file.TokenFileError as exc:
        logger.error("Refusing to start: RIG_API_TOKEN_FILE: %s", exc)
        return EXIT_USAGE
    except lease.AgentError as exc:
        logger.error("%s", exc)
        return EXIT_FAILED
    except RedisError as exc:
        text = str(exc).strip()
        logger.error(
            "Redis unavailable: %s: %s", type(exc).__name__, text.splitlines()[0] if text else ""
        )
        return EXIT_FAILED
    return EXIT_OK


def _standalone(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rig-conductor agent")
    add_arguments(parser)
    return main(parser.parse_args(argv), configure_logging=True)


if __name__ == "__main__":
    sys.exit(_standalone())
