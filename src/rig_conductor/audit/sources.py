"""The audit's readers: the event log through Spark's JDBC source, Redis on the driver.

I/O only: builds SQL and JDBC options, reads, and hands plain rows or DataFrames to `main`.
Decides nothing about what the rows mean (that is `reconcile`'s job).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote

import redis
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from rig_conductor.adapters.redis import client as redis_client
from rig_conductor.adapters.redis import keys as redis_keys
from rig_conductor.adapters.redis.client import AnySyncRedis
from rig_conductor.settings_base import RigSettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

logger = logging.getLogger(__name__)

JDBC_DRIVER = "org.postgresql.Driver"
ROWS_PER_PARTITION = 250_000  # events per JDBC read partition
FETCH_SIZE = 10_000  # rows per round trip; also makes the driver stream instead of buffering
REDIS_PAGE = 10_000  # XPENDING / XRANGE rows per call

# libpq URL parameters that pgjdbc understands, and what pgjdbc calls them.
_JDBC_PARAMETERS = {
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "sslcert": "sslcert",
    "sslkey": "sslkey",
    "sslpassword": "sslpassword",
    "application_name": "ApplicationName",
    "connect_timeout": "connectTimeout",
    "options": "options",
    "target_session_attrs": "targetServerType",
}


class SourceError(Exception):
    """A configuration the audit cannot read from, phrased as one line for the operator."""


@dataclass(frozen=True, slots=True)
class JdbcSource:
    """A JDBC URL and connection properties; the password stays out of the URL."""

    url: str
    properties: Mapping[str, str]

    def options(self) -> dict[str, str]:
        return {"url": self.url, **self.properties}


def jdbc_source(database_url: str) -> JdbcSource:
    """RIG_DATABASE_URL (SQLAlchemy form, `postgresql+psycopg://u:p@host:5432/db?...`) as JDBC.

    Spark's JDBC driver talks TCP only: a Unix-socket URL (`?host=/run/postgresql`) is refused.
    """
    try:
        url = make_url(database_url)
    except ArgumentError:
        raise SourceError("RIG_DATABASE_URL: is not a database URL") from None
    query = {
        key: value if isinstance(value, str) else value[-1] for key, value in url.query.items()
    }
    host = url.host or query.pop("host", None)
    query.pop("host", None)
    if not host or host.startswith("/"):
        raise SourceError(
            "RIG_DATABASE_URL: the audit reads PostgreSQL through JDBC, which needs a TCP host "
            "(host:port), not a Unix socket"
        )
    netloc = f"[{host}]" if ":" in host else host
    database = url.database or url.username or "postgres"
    properties = {"driver": JDBC_DRIVER, "ApplicationName": "rig-conductor-audit"}
    if url.username:
        properties["user"] = url.username
    if url.password:
        properties["password"] = str(url.password)
    for key, value in query.items():
        if key in _JDBC_PARAMETERS:
            properties[_JDBC_PARAMETERS[key]] = value
        else:
            logger.info("RIG_DATABASE_URL parameter %s has no JDBC equivalent; ignored", key)
    # prepareThreshold=0: pgjdbc never names a server-side prepared statement, so the audit
    # reads through PgBouncer in transaction pooling mode too (as the conductor's psycopg does).
    return JdbcSource(
        f"jdbc:postgresql://{netloc}:{url.port or 5432}/{quote(database, safe='')}"
        "?prepareThreshold=0",
        properties,
    )


def sql_literal(value: str) -> str:
    """A SQL string literal (standard_conforming_strings, on since PostgreSQL 9.1)."""
    return "'" + value.replace("'", "''") + "'"


def _timestamp(value: datetime) -> str:
    aware = value if value.tzinfo else value.replace(tzinfo=UTC)
    return f"TIMESTAMPTZ {sql_literal(aware.astimezone(UTC).isoformat())}"


def event_filter(
    *,
    tenant: str,
    since: datetime | None = None,
    until: datetime | None = None,
    after_id: int | None = None,
    up_to_id: int | None = None,
    kinds: Sequence[str] = (),
) -> str:
    """The WHERE clause of an event read: tenant, `since <= occurred_at < until`, id range."""
    clauses = [f"tenant = {sql_literal(tenant)}"]
    if since is not None:
        clauses.append(f"occurred_at >= {_timestamp(since)}")
    if until is not None:
        clauses.append(f"occurred_at < {_timestamp(until)}")
    if after_id is not None:
        clauses.append(f"id > {int(after_id)}")
    if up_to_id is not None:
        clauses.append(f"id <= {int(up_to_id)}")
    if kinds:
        clauses.append(f"kind IN ({', '.join(sql_literal(kind) for kind in kinds)})")
    return " AND ".join(clauses)


@dataclass(frozen=True, slots=True)
class EventBounds:
    """What the window holds: id range, row count, first event time; and whether the schema
    has `entry_ids` (migration 0003: events about several entries)."""

    low: int | None
    high: int | None
    rows: int
    first_at: datetime | None
    has_entry_ids: bool


def read_bounds(spark: SparkSession, source: JdbcSource, *, where: str) -> EventBounds:
    query = (
        "SELECT min(id) AS low, max(id) AS high, count(*) AS n, min(occurred_at) AS first_at, "
        "(SELECT count(*) FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND table_name = 'events' AND column_name = 'entry_ids') AS has_entry_ids "
        f"FROM events WHERE {where}"
    )
    row = (
        spark.read.format("jdbc").options(**source.options()).option("query", query).load().first()
    )
    assert row is not None  # an aggregate always answers one row
    first_at = row["first_at"]
    return EventBounds(
        low=None if row["low"] is None else int(row["low"]),
        high=None if row["high"] is None else int(row["high"]),
        rows=int(row["n"]),
        first_at=first_at.astimezone(UTC) if first_at is not None else None,
        has_entry_ids=bool(row["has_entry_ids"]),
    )


def events_query(where: str, *, detail_kinds: Sequence[str], has_entry_ids: bool) -> str:
    """The subquery Spark reads: every column the rules use, `detail` only where they use it."""
    kinds = ", ".join(sql_literal(kind) for kind in detail_kinds)
    entry_ids = "array_to_string(entry_ids, ',')" if has_entry_ids else "CAST(NULL AS text)"
    return (
        "(SELECT id, occurred_at, kind, agent_id, consumer, stream, group_name, entry_id, "
        "issue_id, attempt, fenced, "
        f"CASE WHEN kind IN ({kinds}) THEN detail::text END AS detail, "
        f"{entry_ids} AS entry_ids "
        f"FROM events WHERE {where}) AS audit_events"
    )


def partitions_for(rows: int, *, parallelism: int) -> int:
    """Enough partitions for ROWS_PER_PARTITION each, at most two per core and at least one."""
    return max(1, min(math.ceil(rows / ROWS_PER_PARTITION), 2 * max(parallelism, 1)))


def read_events(
    spark: SparkSession,
    source: JdbcSource,
    *,
    where: str,
    bounds: EventBounds | None,
    partitions: int,
) -> DataFrame:
    """The events matching `where`, as `vocabulary.EVENTS_SCHEMA`.

    With `bounds`, the read is split into `partitions` ranges of `id` (Spark's partitioned JDBC
    read: one query and one connection per partition); without, one query.
    """
    from pyspark.sql import functions as F

    from rig_conductor.audit import vocabulary

    has_entry_ids = bounds.has_entry_ids if bounds is not None else True
    table = events_query(where, detail_kinds=vocabulary.DETAIL_KINDS, has_entry_ids=has_entry_ids)
    reader = (
        spark.read.format("jdbc")
        .options(**source.options())
        .option("dbtable", table)
        .option("fetchsize", str(FETCH_SIZE))
    )
    if bounds is not None and bounds.low is not None and bounds.high is not None and partitions > 1:
        reader = (
            reader.option("partitionColumn", "id")
            .option("lowerBound", str(bounds.low))
            .option("upperBound", str(bounds.high + 1))
            .option("numPartitions", str(partitions))
        )
    raw = reader.load()
    ids = F.col("entry_ids")
    raw = raw.withColumn("entry_ids", F.when(F.length(ids) > 0, F.split(ids, ",")))
    return raw.select(
        *(F.col(f.name).cast(f.dataType).alias(f.name) for f in vocabulary.EVENTS_SCHEMA.fields)
    )


def intervals_query(*, tenant: str, since: datetime | None, until: datetime | None) -> str:
    """The subquery of the agents' liveness intervals that touch the window: the ended ones
    (`liveness`, agent rows) and the open one of each agent (`agent_heartbeats`)."""
    ended = [f"tenant = {sql_literal(tenant)}", "consumer IS NULL"]
    current = [f"tenant = {sql_literal(tenant)}", "beats > 0"]
    if since is not None:
        ended.append(f"heard_to >= {_timestamp(since)}")
        current.append(f"last_heartbeat_at >= {_timestamp(since)}")
    if until is not None:
        ended.append(f"heard_from < {_timestamp(until)}")
        current.append(f"COALESCE(heard_since, last_heartbeat_at) < {_timestamp(until)}")
    return (
        "(SELECT agent_id, heard_from, heard_to, beats FROM liveness "
        f"WHERE {' AND '.join(ended)} "
        "UNION ALL SELECT agent_id, COALESCE(heard_since, last_heartbeat_at) AS heard_from, "
        "last_heartbeat_at AS heard_to, beats FROM agent_heartbeats "
        f"WHERE {' AND '.join(current)}) AS audit_intervals"
    )


def read_intervals(
    spark: SparkSession,
    source: JdbcSource,
    *,
    tenant: str,
    since: datetime | None,
    until: datetime | None,
) -> DataFrame:
    """The agents' liveness intervals in the window, as `vocabulary.INTERVALS_SCHEMA`: one row
    per agent and unbroken stretch of heartbeats, so a small read whatever the fleet's rate."""
    from pyspark.sql import functions as F

    from rig_conductor.audit import vocabulary

    raw = (
        spark.read.format("jdbc")
        .options(**source.options())
        .option("dbtable", intervals_query(tenant=tenant, since=since, until=until))
        .option("fetchsize", str(FETCH_SIZE))
        .load()
    )
    return raw.select(
        *(F.col(f.name).cast(f.dataType).alias(f.name) for f in vocabulary.INTERVALS_SCHEMA.fields)
    )


@dataclass
class RedisSnapshot:
    """Pending entries and dead letters of the dispatched streams, as Redis held them."""

    taken_at: datetime
    # (stream, entry_id, group, consumer, state): vocabulary.PENDING_SCHEMA
    pending: list[tuple[str, str, str | None, str | None, str]] = field(default_factory=list)
    # vocabulary.DEAD_LETTER_QUEUE_SCHEMA
    letters: list[
        tuple[str, str, str | None, str | None, str | None, int | None, str | None, str | None]
    ] = field(default_factory=list)
    streams: int = 0
    missing: list[str] = field(default_factory=list)
    groups: int = 0


def connect(settings: RigSettings) -> AnySyncRedis:
    """A synchronous client in the configured topology: the audit reads Redis once, on the
    driver."""
    return redis_client.connect_sync(settings, socket_timeout=60)


def read_redis(
    client: AnySyncRedis, *, streams: Iterable[str], page_size: int = REDIS_PAGE
) -> RedisSnapshot:
    """For each stream: every group's whole pending entries list (paged XPENDING), the entries
    still above each group's last-delivered id (all entries, for a stream with no group yet), and
    every letter of `<stream>:dlq`."""
    seconds, micros = client.time()
    snapshot = RedisSnapshot(taken_at=datetime.fromtimestamp(seconds + micros / 1e6, UTC))
    for stream in sorted(set(streams)):
        snapshot.streams += 1
        if client.type(stream) == "stream":
            _read_stream(client, stream, snapshot, page_size)
        else:
            snapshot.missing.append(stream)
        _read_letters(client, stream, snapshot, page_size)
    return snapshot


def _read_stream(client: AnySyncRedis, stream: str, snapshot: RedisSnapshot, page: int) -> None:
    groups = client.xinfo_groups(stream)
    snapshot.groups += len(groups)
    if not groups:
        for entry_id in _range_ids(client, stream, "-", page):
            snapshot.pending.append((stream, entry_id, None, None, "undelivered"))
        return
    for group in groups:
        name = str(group["name"])
        start = "-"
        while True:
            rows = cast(
                list[dict[str, Any]],
                client.xpending_range(stream, name, min=start, max="+", count=page),
            )
            snapshot.pending.extend(
                (stream, str(row["message_id"]), name, str(row["consumer"]), "pel") for row in rows
            )
            if len(rows) < page:
                break
            start = "(" + str(rows[-1]["message_id"])
        last_delivered = str(group["last-delivered-id"])
        for entry_id in _range_ids(client, stream, "(" + last_delivered, page):
            snapshot.pending.append((stream, entry_id, name, None, "undelivered"))


def _range_ids(client: AnySyncRedis, key: str, start: str, page: int) -> list[str]:
    ids: list[str] = []
    while True:
        rows = cast(list[tuple[str, Any]], client.xrange(key, min=start, max="+", count=page))
        ids.extend(entry_id for entry_id, _ in rows)
        if len(rows) < page:
            return ids
        start = "(" + rows[-1][0]


def _read_letters(client: AnySyncRedis, stream: str, snapshot: RedisSnapshot, page: int) -> None:
    key = redis_keys.dlq_key(stream, clustered=isinstance(client, redis.RedisCluster))
    start = "-"
    while True:
        rows = cast(
            list[tuple[str, dict[str, str]]], client.xrange(key, min=start, max="+", count=page)
        )
        for dlq_id, fields in rows:
            deliveries = fields.get("deliveries")
            snapshot.letters.append(
                (
                    stream,
                    dlq_id,
                    fields.get("originalId"),
                    fields.get("group"),
                    fields.get("consumer"),
                    int(deliveries) if deliveries and deliveries.isdigit() else None,
                    fields.get("reason"),
                    fields.get("issueId"),
                )
            )
        if len(rows) < page:
            return
        start = "(" + rows[-1][0]
