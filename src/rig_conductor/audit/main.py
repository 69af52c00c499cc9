"""`rig-conductor audit`: reconcile the event log with Redis and write what went wrong.

The I/O half of the audit, in order: start (or join) a Spark session, read the window's events
over JDBC, snapshot the pending lists and dead-letter queues of the dispatched streams, apply
`reconcile`'s rules, then write Parquet tables, the plots, report.html and, last, summary.json.
PySpark and matplotlib are imported when the command runs, never when the CLI is built, so the
rest of rig-conductor works without the `audit` extra. Must not import the API or the reaper.

Besides `rig-conductor audit`, it runs as `python -m rig_conductor.audit` and under spark-submit:

    spark-submit --master spark://host:7077 --jars /usr/share/java/postgresql.jar \\
        "$(python -c 'import rig_conductor.audit.main as m; print(m.__file__)')" --output DIR
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rig_conductor.audit.job import run
from rig_conductor.audit.session import (
    AuditError,
    AuditOptions,
    describe,
    preflight,
    spark_session,
)
from rig_conductor.audit.stages import ms_since
from rig_conductor.settings import Settings, settings_for

logger = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


# ---------------------------------------------------------------------------------- command line


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `audit` on the CLI's subparsers; the command is `main(args, settings)`."""
    parser = subparsers.add_parser(
        "audit",
        help="reconcile the event log with Redis (PySpark): lost, duplicate, dead-lettered work",
        description="Reads the event log over JDBC and the pending lists and dead-letter queues "
        "from Redis, and writes DIR/summary.json, Parquet tables and DIR/report.html.",
    )
    configure_parser(parser)
    parser.set_defaults(command=main)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--since",
        type=parse_instant,
        metavar="ISO",
        help="events at or after this instant (ISO 8601; UTC when it has no offset)",
    )
    parser.add_argument(
        "--until", type=parse_instant, metavar="ISO", help="events before this instant"
    )
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="DIR",
        help="where summary.json, report.html and the Parquet tables go (created if missing)",
    )
    parser.add_argument(
        "--master",
        metavar="URL",
        help="Spark master (default: spark-submit's, else local[*])",
    )
    parser.add_argument(
        "--partitions",
        type=_positive_int,
        metavar="N",
        help="JDBC read partitions (default: one per 250,000 events, at most two per core)",
    )
    parser.add_argument(
        "--conf",
        type=_spark_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, as spark-submit's --conf (repeatable)",
    )


def parse_instant(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 instant: {text!r}") from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _spark_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def main(args: argparse.Namespace, settings: Settings) -> int:
    """The `audit` command: 0 once the findings are written, whatever they say."""
    options = AuditOptions.from_args(args, os.environ)
    try:
        source = preflight(options, settings)
    except AuditError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    started = time.perf_counter()
    try:
        spark, owned = spark_session(options)
    except Exception as exc:
        logger.error("Spark did not start: %s", describe(exc))
        return EXIT_FAILED
    timings = {"sparkStartMs": ms_since(started)}
    try:
        summary = run(spark, settings=settings, options=options, source=source, timings=timings)
    except Exception as exc:
        logger.error("Audit failed: %s", describe(exc))
        return EXIT_FAILED
    finally:
        if owned:
            spark.stop()
    logger.info(
        "Audit done: %d dispatched, %d completed, %d dead-lettered, %d pending, %d lost, "
        "%d duplicates, %d reclaims; wrote %s",
        summary["dispatched"],
        summary["completed"],
        summary["deadLettered"],
        summary["pending"],
        summary["lostCount"],
        summary["duplicateCount"],
        summary["reclaims"],
        options.output / "summary.json",
    )
    _record_verdict(settings, summary, options.output)
    return EXIT_OK


def _record_verdict(settings: Settings, summary: dict[str, Any], output: Path) -> None:
    """The verdict in PostgreSQL, for the conductor's rig_audit_* gauges and the alert on them.
    The audit's files are written already: a failure here is a warning, not a failed audit."""
    from rig_conductor.adapters.postgres import audits

    try:
        audits.record_audit(
            settings.sqlalchemy_url,
            tenant=settings.tenant,
            dispatched=summary["dispatched"],
            lost=summary["lostCount"],
            duplicates=summary["duplicateCount"],
            output=str(output),
        )
    except Exception as exc:
        logger.warning("Audit verdict not recorded in PostgreSQL: %s", describe(exc))


# ------------------------------------------------------------------------- spark-submit entry


def run_from_environment(argv: Sequence[str] | None = None) -> int:
    """`python -m rig_conductor.audit` and spark-submit: settings from the RIG_* environment."""
    from rig_conductor import logs

    parser = argparse.ArgumentParser(
        prog="rig-conductor-audit", description="rig-conductor's PySpark reconciliation job"
    )
    configure_parser(parser)
    args = parser.parse_args(argv)
    settings = settings_for("rig-conductor audit")
    if settings is None:
        return EXIT_USAGE
    logs.configure(settings.log_format)
    return main(args, settings)


if __name__ == "__main__":
    sys.exit(run_from_environment())
