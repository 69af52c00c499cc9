"""The `rig-conductor` command line. Builds the settings once and hands them down.

Operator mistakes end with one line on stderr and exit 2, never a traceback. stdout carries
only results (the JSON of `reap --once`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from rig_conductor import __version__, gcpolicy, logs, redis_rights
from rig_conductor.settings import Settings, settings_for

if TYPE_CHECKING:
    from rig_conductor.reaper.cycle import ScanReport

logger = logging.getLogger("rig_conductor")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

Command = Callable[[argparse.Namespace, Settings], int]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = settings_for("rig-conductor")
    if settings is None:
        return EXIT_USAGE
    logs.configure(settings.log_format)
    command: Command = args.command
    try:
        return command(args, settings)
    except KeyboardInterrupt:
        return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rig-conductor",
        description="Reclaims Redis Streams entries stuck with dead consumers.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="HTTP API and the scheduled reaper")
    serve.set_defaults(command=_serve)

    migrate = sub.add_parser("migrate", help="upgrade the database schema to head (idempotent)")
    migrate.set_defaults(command=_migrate)

    reap = sub.add_parser("reap", help="run one reaper scan and print its report as JSON")
    reap.add_argument("--once", action="store_true", required=True, help="one scan, then exit")
    reap.add_argument("--dry-run", action="store_true", help="decide and log, change nothing")
    reap.set_defaults(command=_reap)

    check = sub.add_parser(
        "check", help="exit 0 when Redis and PostgreSQL answer and the schema is current"
    )
    check.set_defaults(command=_check)

    demo = sub.add_parser("demo", help="end-to-end demo on embedded Redis and PostgreSQL")
    demo.add_argument(
        "--timeout", type=float, default=90.0, help="give up on the story after this many seconds"
    )
    demo.add_argument(
        "--once",
        action="store_true",
        help="exit after the story (0 when every issue was built): for scripts and tests; "
        "the default when stdout is not a terminal",
    )
    demo.add_argument(
        "--keep-running",
        action="store_true",
        help="after the story, a live fleet until Ctrl-C: the default at a terminal",
    )
    demo.add_argument(
        "--watch",
        action="store_true",
        help="pace the story for the console: 10 s to open it, slower thresholds; keeps running",
    )
    demo.add_argument(
        "-v", "--verbose", action="store_true", help="also log the migrations and servers' chatter"
    )
    demo.set_defaults(command=_demo)

    from rig_conductor.agent import cli as agent_cli
    from rig_conductor.audit import main as audit
    from rig_conductor.ops_cli import commands as ops_commands

    agent_cli.add_parser(sub)
    audit.add_parser(sub)
    redis_rights.add_parser(sub)
    ops_commands.add_parsers(sub)
    return parser


def _serve(args: argparse.Namespace, settings: Settings) -> int:
    from rig_conductor import serving
    from rig_conductor.app import create_app

    if (problem := settings.anonymous_problem()) is not None:
        print(f"rig-conductor: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if (problem := _schema_problem(settings)) is not None:
        logger.error("%s", problem)
        return EXIT_USAGE
    logger.info(
        "rig-conductor %s, effective configuration: %s",
        __version__,
        json.dumps(settings.describe(), default=str),
    )
    if settings.dry_run:
        logger.warning(
            "DRY RUN: the reaper logs and counts its decisions and changes nothing in Redis"
        )
    if settings.session_secret is None:
        logger.warning(
            "RIG_SESSION_SECRET is empty: console sessions are signed with a random key of this "
            "process, so they do not survive a restart nor work across replicas, and the token "
            "fingerprints in audit lines change with every start"
        )
    if (problem := _redis_access_problem(settings)) is not None:
        logger.error("Refusing to start: %s", problem)
        return EXIT_USAGE
    from rig_conductor.adapters import kubernetes, token_review
    from rig_conductor.reaper import podwatch

    try:
        kube = podwatch.api_client(settings, environ=os.environ)
    except kubernetes.KubernetesConfigError as exc:
        logger.error("RIG_K8S_ENABLED=true, but %s", exc)
        return EXIT_USAGE
    if (problem := token_review.startup_problem(settings, environ=os.environ)) is not None:
        logger.error("%s", problem)
        return EXIT_USAGE
    config = serving.config(
        create_app(settings, kube=kube), host=settings.http_host, port=settings.http_port
    )
    server = _server_class()(config)
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits on a port it cannot bind, having said why
        logger.error(
            "Could not serve on %s:%d: choose another RIG_HTTP_HOST / RIG_HTTP_PORT",
            settings.http_host,
            settings.http_port,
        )
        return int(exc.code or EXIT_FAILED)
    return EXIT_OK if server.started else EXIT_FAILED


def _server_class() -> type:
    import uvicorn

    from rig_conductor.app import stop_listening

    class Server(uvicorn.Server):
        """uvicorn's server, with the collector tuned once started (`gcpolicy`), the app told
        when it stops taking connections (`app.stop_listening`), minus re-raising SIGTERM/SIGINT
        after the graceful shutdown.

        uvicorn re-sends the signal it caught once it has shut down, which ends the process
        "killed by SIGTERM"; the contract wants `serve` to exit 0 after a graceful shutdown.
        """

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            gcpolicy.after_startup()  # the app and its clients are loaded: freeze them

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            stop_listening(self.config.app)  # as it stops taking connections, before the drain
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {
                sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def _migrate(args: argparse.Namespace, settings: Settings) -> int:
    from sqlalchemy.exc import OperationalError, SQLAlchemyError

    from rig_conductor.adapters.postgres import engine as pg
    from rig_conductor.adapters.postgres import migrations

    try:
        migrations.upgrade(settings.sqlalchemy_url)
        revision = migrations.current_revision(settings.sqlalchemy_url)
    except (OperationalError, OSError) as exc:  # never reached the database
        logger.error("Migration failed: %s", pg.describe_failure(exc))
        return EXIT_FAILED
    except SQLAlchemyError as exc:
        logger.error("Migration failed: %s", _first_line(exc))
        return EXIT_FAILED
    logger.info("Database schema is at revision %s (head)", revision)
    return EXIT_OK


def _reap(args: argparse.Namespace, settings: Settings) -> int:
    dry_run = args.dry_run or settings.dry_run
    if dry_run:
        logger.warning("DRY RUN: decisions are logged and counted, nothing in Redis changes")
    report = asyncio.run(_reap_once(settings, dry_run))
    if isinstance(report, int):
        return report
    sys.stdout.write(report.model_dump_json(by_alias=True) + "\n")
    return EXIT_OK


async def _reap_once(settings: Settings, dry_run: bool) -> ScanReport | int:
    """The schema check, the permission probe and the scan on one event loop, one Redis client
    and one engine: the command's start-up is part of every scan an operator runs by hand."""
    from rig_conductor.adapters.postgres import engine as pg
    from rig_conductor.adapters.redis import access as redis_access
    from rig_conductor.adapters.redis import client as redis_client
    from rig_conductor.effects import port
    from rig_conductor.reaper import cycle

    gcpolicy.loaded()
    redis = redis_client.connect(settings)
    engine = pg.create_engine(settings.sqlalchemy_url, pool_size=2)
    topology = redis_client.Topology(redis, settings)
    try:
        if (problem := await pg.schema_problem(engine)) is not None:
            logger.error("%s", problem)
            return EXIT_USAGE
        try:
            missing = await redis_access.missing_permission(
                redis, role="conductor", streams=[settings.dispatch_stream, *settings.streams]
            )
        except Exception as exc:
            logger.warning("Redis permissions not checked: %s", redis_access.describe_failure(exc))
            missing = None
        if missing is not None:
            logger.error("%s", missing)
            return EXIT_USAGE
        try:
            effects = port.choose(
                dry_run,
                engine=engine,
                tenant=settings.tenant,
                remember_s=settings.event_retention_days * 86_400,
            )
            return await cycle.reap_once(
                redis=topology, engine=engine, settings=settings, effects=effects
            )
        except Exception as exc:
            logger.error("Scan failed: %s", cycle.describe_failure(exc))
            return EXIT_FAILED
    finally:
        await topology.aclose()
        await redis.aclose()
        await engine.dispose()


def _redis_access_problem(settings: Settings) -> str | None:
    """One line naming a permission the conductor's Redis user lacks; None when it has them
    all, or when Redis cannot be reached now (the scans and /readyz report that)."""
    from rig_conductor.adapters.redis import access as redis_access
    from rig_conductor.adapters.redis import client as redis_client

    async def probe() -> str | None:
        client = redis_client.connect(settings)
        try:
            return await redis_access.missing_permission(
                client, role="conductor", streams=[settings.dispatch_stream, *settings.streams]
            )
        finally:
            await client.aclose()

    try:
        return asyncio.run(probe())
    except Exception as exc:
        logger.warning("Redis permissions not checked: %s", redis_access.describe_failure(exc))
        return None


def _check(args: argparse.Namespace, settings: Settings) -> int:
    from rig_conductor.adapters.redis import access as redis_access
    from rig_conductor.adapters.redis import client as redis_client

    problems: list[str] = []

    async def ping() -> str | None:
        client = redis_client.connect(settings)
        try:
            await client.ping()
            return await redis_access.missing_permission(
                client, role="conductor", streams=[settings.dispatch_stream, *settings.streams]
            )
        finally:
            await client.aclose()

    try:
        if (missing := asyncio.run(ping())) is not None:
            problems.append(missing)
    except Exception as exc:
        problems.append(redis_access.describe_failure(exc))
    if (problem := _schema_problem(settings)) is not None:
        problems.append(problem)
    for problem in problems:
        logger.error("%s", problem)
    if not problems:
        logger.info("Redis and PostgreSQL answer; the schema is current")
    return EXIT_FAILED if problems else EXIT_OK


def _schema_problem(settings: Settings) -> str | None:
    """None when PostgreSQL answers and its schema is at head; else what is wrong, in one line."""
    from rig_conductor.adapters.postgres import engine as pg

    async def check() -> str | None:
        engine = pg.create_unpooled_engine(settings.sqlalchemy_url)
        try:
            return await pg.schema_problem(engine)
        finally:
            await engine.dispose()

    return asyncio.run(check())


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from rig_conductor import demo

    if args.once and args.keep_running:
        print("rig-conductor: demo: --once and --keep-running contradict", file=sys.stderr)
        return EXIT_USAGE
    if not args.verbose:
        for chatty in demo.CHATTY_LOGGERS:
            logging.getLogger(chatty).setLevel(logging.WARNING)
        # pgserver logs a failed command's whole output; the demo says it in one line.
        logging.getLogger("pgserver").setLevel(logging.CRITICAL)
    once = args.once or not (args.keep_running or args.watch or sys.stdout.isatty())
    if once and not args.once:
        logger.info(
            "stdout is not a terminal: the demo exits after the story, as with --once "
            "(--keep-running keeps the console up with a live fleet until Ctrl-C)"
        )
    return demo.run(
        timeout_s=args.timeout, log_format=settings.log_format, once=once, watch=args.watch
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
