"""Shared pieces of the audit tests: one local[2] Spark session for the whole run, and the
rules for when those tests may skip.

Import the fixtures into a test module (`from tests.audit_conftest import spark_fixture`). Off CI a
missing prerequisite (PySpark, Java 17+, the JDBC jar) skips with the reason;
with `CI` set it fails instead, so CI never passes by skipping the audit.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest
from sqlalchemy.engine import make_url

from tests.spark.cluster import SparkCluster

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


JDBC_JAR = Path(os.environ.get("RIG_JDBC_JAR") or "/usr/share/java/postgresql.jar")


def unavailable(reason: str, *, module: bool = False) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the audit tests must run, not skip)", pytrace=False)
    pytest.skip(reason, allow_module_level=module)


def require_pyspark() -> None:
    """At the top of a test module that imports PySpark or matplotlib."""
    try:
        import matplotlib  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        unavailable(f"{exc.name} is not installed: pip install 'rig-conductor[audit]'", module=True)


def _java_found() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        return Path(java_home, "bin", "java").exists()
    return shutil.which("java") is not None


@functools.cache
def _session() -> SparkSession:
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("rig-conductor-audit-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.log.level", "ERROR")
        .config("spark.driver.memory", "768m")
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    )
    if JDBC_JAR.is_file():
        builder = builder.config("spark.jars", str(JDBC_JAR))
    session = builder.getOrCreate()
    atexit.register(session.stop)
    return session


@pytest.fixture(scope="session", name="spark")
def spark_fixture() -> Iterator[SparkSession]:
    """A local[2] session shared by every audit test module (built once per process)."""
    require_pyspark()
    if not _java_found():
        unavailable("no Java for PySpark (needs Java 17+)")
    yield _session()


@pytest.fixture(scope="session", name="jdbc_ready")
def jdbc_ready_fixture(database_url: str) -> str:
    """The test database, when Spark's JDBC driver can reach it (the jar, and TCP: the embedded
    PostgreSQL listens on loopback too)."""
    if not JDBC_JAR.is_file():
        unavailable(
            f"no PostgreSQL JDBC driver at {JDBC_JAR} (apt-get install libpostgresql-jdbc-java)"
        )
    url = make_url(database_url)
    host = url.host or url.query.get("host")
    if not host or str(host).startswith("/"):
        unavailable(
            "RIG_TEST_DATABASE_URL names a Unix socket; Spark JDBC needs a TCP host and port"
        )
    return database_url


@pytest.fixture(scope="module", name="cluster")
def cluster_fixture(
    jdbc_ready: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkCluster]:
    """A Spark standalone master and two one-core workers from the wheel, for one module."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        unavailable("no Java for the Spark cluster (needs Java 17+)")
    made = SparkCluster(Path(tmp_path_factory.mktemp("spark")))
    try:
        yield made.start()
    finally:
        made.stop()
