"""The audit's Spark session: its prerequisites (Java, the JDBC jar, the database URL) and its
configuration, sized to the master it runs on."""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rig_conductor.settings import Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rig_conductor.audit.sources import JdbcSource

logger = logging.getLogger(__name__)

JDBC_JAR_ENV = "RIG_JDBC_JAR"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
MIN_JAVA = 17


class AuditError(Exception):
    """An operator mistake or a missing prerequisite: one line, exit 2."""


HADOOP_GLOB = "[]{}*?\\"  # characters of a Hadoop path pattern


def preflight(options: AuditOptions, settings: Settings) -> JdbcSource:
    """Everything checkable before Spark starts; raises AuditError with one line."""
    try:
        import matplotlib  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise AuditError(
            f"the audit needs PySpark and matplotlib ({exc.name} is missing): "
            "pip install 'rig-conductor[audit]'"
        ) from None
    from rig_conductor.audit import sources

    if options.since and options.until and options.since >= options.until:
        raise AuditError("--since must be before --until")
    if options.output.exists() and not options.output.is_dir():
        raise AuditError(f"--output {options.output} exists and is not a directory")
    globbed = sorted(set(HADOOP_GLOB) & set(str(options.output.resolve())))
    if globbed:
        # The audit reads back what it wrote there, and Hadoop takes these for a pattern.
        raise AuditError(
            f"--output {options.output}: a path with {' '.join(globbed)} in it cannot be read "
            "back by Spark (Hadoop takes those characters for a pattern); choose another"
        )
    if not options.jdbc_jar.is_file():
        raise AuditError(
            f"{JDBC_JAR_ENV}: no PostgreSQL JDBC driver at {options.jdbc_jar} (install Debian's "
            f"libpostgresql-jdbc-java, or point {JDBC_JAR_ENV} at postgresql-<version>.jar)"
        )
    if not _jvm_running():
        check_java()
    try:
        return sources.jdbc_source(settings.sqlalchemy_url)
    except sources.SourceError as exc:
        raise AuditError(str(exc)) from None


def _jvm_running() -> bool:
    """spark-submit starts the JVM before Python and says where to reach it."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def check_java() -> None:
    """PySpark 4 needs Java 17+, found the way Spark finds it: JAVA_HOME, else PATH."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home, "bin", "java")) if java_home else shutil.which("java")
    if not java or not Path(java).exists():
        raise AuditError(
            f"the audit needs Java {MIN_JAVA}+ and found none "
            f"({'JAVA_HOME=' + java_home if java_home else 'no java on PATH'})"
        )
    try:
        answer = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AuditError(f"{java} -version failed: {exc}") from None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', answer.stderr + answer.stdout)
    if found is None:
        raise AuditError(f"{java} -version did not say which version it is")
    major = int(found.group(2) or 0) if found.group(1) == "1" else int(found.group(1))
    if major < MIN_JAVA:
        raise AuditError(f"the audit needs Java {MIN_JAVA}+; {java} is Java {major}")


def describe(exc: BaseException) -> str:
    """One line for a failure; for one raised in the JVM, its root cause (the driver's own
    message, such as `PSQLException: Connection to host:5432 refused`) after Spark's."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    line = f"{type(exc).__name__}: {first}"
    throwable = getattr(exc, "_origin", None) or getattr(exc, "java_exception", None)
    root = ""
    try:
        throwable = throwable.getCause() if throwable is not None else None
        while throwable is not None:
            described = str(throwable.toString())
            # The deepest cause, but PostgreSQL's driver says best what went wrong.
            if not root.startswith("org.postgresql.") or described.startswith("org.postgresql."):
                root = described
            throwable = throwable.getCause()
    except Exception:  # the JVM may be gone already; Spark's own line is still there
        root = ""
    root = root.strip().splitlines()[0] if root.strip() else ""
    if not root:
        return line
    name, _, message = root.partition(": ")
    short = name.rsplit(".", 1)[-1]
    return f"{line} ({short}: {message})" if message else f"{line} ({short})"


# -------------------------------------------------------------------------------------- session


def spark_session(options: AuditOptions) -> tuple[SparkSession, bool]:
    """The session to run in, and whether this run owns it (and so stops it).

    A session that already exists in this process (a notebook, a test) is used as it is.
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:
        existing = SparkSession.active()
    except PySparkRuntimeError:
        existing = None
    if existing is not None:
        logger.info("Running in the existing Spark session (%s)", existing.sparkContext.master)
        return existing, False
    master = options.master or (None if _jvm_running() else "local[*]")
    builder = SparkSession.builder.appName("rig-conductor-audit")
    if master is not None:
        builder = builder.master(master)
    for key, value in spark_conf(options, master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    configured = {key for key, _ in options.conf}
    if not (spark.sparkContext.master or "local").startswith("local") and (
        "spark.sql.shuffle.partitions" not in configured
    ):
        # On a cluster: two shuffle partitions per executor core, not Spark's 200 (which made a
        # small audit run thousands of tasks). AQE coalesces further where the data is small.
        partitions = cluster_shuffle_partitions(spark.sparkContext.defaultParallelism)
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return spark, True


def spark_conf(options: AuditOptions, master: str | None) -> dict[str, str]:
    """Small defaults for a small machine; every one can be overridden with --conf."""
    conf = {
        "spark.jars": str(options.jdbc_jar),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.showConsoleProgress": "false",
        "spark.log.level": "WARN",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
    }
    if master is not None and master.startswith("local"):
        conf["spark.ui.enabled"] = "false"  # no port 4040 to fight over with other jobs
        conf["spark.sql.shuffle.partitions"] = str(local_shuffle_partitions(master))
    conf.update(options.conf)
    return conf


def cluster_shuffle_partitions(cores: int) -> int:
    """Two per executor core of the cluster, between 4 and 64."""
    return max(4, min(64, 2 * cores))


def local_shuffle_partitions(master: str) -> int:
    """Two per core of `local[N]` (`local[*]`: this machine's), between 4 and 16."""
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    cores = 1
    if found and found.group(1) and found.group(1) != "*":
        cores = int(found.group(1))
    elif found and found.group(1) == "*":
        cores = os.cpu_count() or 1
    return max(4, min(16, 2 * cores))


@dataclass(frozen=True, slots=True)
class AuditOptions:
    output: Path
    since: datetime | None = None
    until: datetime | None = None
    master: str | None = None
    partitions: int | None = None
    conf: Sequence[tuple[str, str]] = ()
    jdbc_jar: Path = Path(DEFAULT_JDBC_JAR)

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> AuditOptions:
        return cls(
            output=Path(args.output),
            since=args.since,
            until=args.until,
            master=args.master,
            partitions=args.partitions,
            conf=tuple(args.conf or ()),
            jdbc_jar=Path(environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR),
        )
