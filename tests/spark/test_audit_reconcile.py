"""The audit's rules on small hand-built frames, on a real local[2] Spark: each rule with the
cases it must catch and the look-alikes it must leave alone."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from tests.audit_conftest import require_pyspark

require_pyspark()

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from rig_conductor.audit import (  # noqa: E402
    duplicates,
    sources,
    tallies,
    timelines,
)
from rig_conductor.audit import main as audit_main  # noqa: E402
from rig_conductor.audit import reconcile as rc  # noqa: E402
from rig_conductor.audit import session as audit_session  # noqa: E402
from rig_conductor.audit import vocabulary as vocab  # noqa: E402
from tests.audit_conftest import spark_fixture  # noqa: E402, F401

if TYPE_CHECKING:
    from pyspark.sql import Row

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
S, S2 = "rig:dispatch", "assignments:ops"
MINUTE = 60_000


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Log:
    """An event log under construction: ids and times follow the order rows are added."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def add(
        self,
        kind: str,
        *,
        when: datetime | None = None,
        agent: str | None = None,
        consumer: str | None = None,
        stream: str | None = S,
        group: str | None = None,
        entry: str | None = None,
        issue: str | None = None,
        attempt: int | None = None,
        fenced: bool = False,
        detail: dict[str, Any] | None = None,
        entries: Sequence[str] | None = None,
    ) -> Log:
        n = len(self.rows) + 1
        self.rows.append(
            (
                n,
                when or at(n),
                kind,
                agent,
                consumer,
                stream,
                group,
                entry,
                issue,
                attempt,
                fenced,
                None if detail is None else json.dumps(detail),
                None if entries is None else list(entries),
            )
        )
        return self

    def assign(self, entry: str, issue: str, *, stream: str = S) -> Log:
        return self.add(
            vocab.ISSUE_ASSIGNED, entry=entry, issue=issue, agent="dev-e", stream=stream
        )

    def work(
        self,
        kind: str,
        entry: str,
        consumer: str,
        attempt: int | None = None,
        *,
        fenced: bool = False,
        issue: str | None = None,
        stream: str = S,
    ) -> Log:
        return self.add(
            kind,
            entry=entry,
            consumer=consumer,
            agent=consumer.rsplit("-", 1)[0],
            attempt=attempt,
            fenced=fenced,
            issue=issue,
            stream=stream,
        )

    def frame(self, spark: SparkSession) -> DataFrame:
        return spark.createDataFrame(self.rows, vocab.EVENTS_SCHEMA)


def pending_frame(spark: SparkSession, *rows: tuple[str, str, str]) -> DataFrame:
    """(stream, entry_id, state): state `pel` (held by c-0 in group g) or `undelivered`."""
    return spark.createDataFrame(
        [(s, e, "g", "c-0" if state == vocab.IN_PEL else None, state) for s, e, state in rows],
        vocab.PENDING_SCHEMA,
    )


def dlq_frame(spark: SparkSession, *rows: tuple[str, str, str, str | None]) -> DataFrame:
    """(stream, dlq_id, original_id, issue_id)."""
    return spark.createDataFrame(
        [(s, d, o, "g", "c-0", 5, "max-deliveries", i) for s, d, o, i in rows],
        vocab.DEAD_LETTER_QUEUE_SCHEMA,
    )


# ------------------------------------------------------------------------------- dispatched


def facts(events: DataFrame) -> DataFrame:
    """Every dispatched entry, as the audit job finds them."""
    return rc.entry_facts(events, rc.replaced_dispatches(events))


def test_dispatched_entries_come_from_assignments_and_requeues(spark: SparkSession) -> None:
    log = (
        Log()
        .assign("1-0", "rc-1")
        .assign("1-0", "rc-1")  # the same entry logged twice counts once
        .add(vocab.HEARTBEAT, agent="dev-e", stream=None)
        .work(vocab.WORK_STARTED, "7-0", "dev-e-0", 1)  # a report alone dispatches nothing
        .add(vocab.DEAD_LETTER_REQUEUED, entry="9-0", issue="rc-1", detail={"dlqId": "5-0"})
    )
    rows = {r["entry_id"]: r for r in facts(log.frame(spark)).collect()}
    assert sorted(rows) == ["1-0", "9-0"]
    assert (rows["1-0"]["origin"], rows["1-0"]["issue_id"], rows["1-0"]["dispatch_event_id"]) == (
        "assigned",
        "rc-1",
        1,
    )
    assert (rows["9-0"]["origin"], rows["9-0"]["requeued_from"]) == ("requeued", "5-0")


def test_a_dispatch_appended_again_replaces_the_entry_redis_lost(spark: SparkSession) -> None:
    log = (
        Log()
        .assign("1-0", "rc-1")
        .assign("2-0", "rc-2")
        .add(vocab.ISSUE_ASSIGNED, entry="8-0", issue="rc-1", agent="dev-e",
             detail={"idempotencyKey": "rc-1", "replaces": "1-0"})
        # Redis lost 3-0 after it was started: replaced too, its holder's reports aside
        .assign("3-0", "rc-3").work(vocab.WORK_STARTED, "3-0", "dev-e-0", 1)
        .add(vocab.ISSUE_ASSIGNED, entry="9-0", issue="rc-3", agent="dev-e",
             detail={"idempotencyKey": "rc-3", "replaces": "3-0"})
        .work(vocab.WORK_COMPLETED, "3-0", "dev-e-0", 1, fenced=True, issue="rc-3")
        .work(vocab.WORK_STARTED, "9-0", "qa-e-0", 1).work(vocab.WORK_COMPLETED, "9-0", "qa-e-0", 1)
    )  # fmt: skip
    rows = {r["entry_id"]: r for r in facts(log.frame(spark)).collect()}
    assert {e: r["issue_id"] for e, r in rows.items()} == {
        "2-0": "rc-2",
        "8-0": "rc-1",
        "9-0": "rc-3",
    }
    assert (rows["9-0"]["completed_by"], rows["9-0"]["fenced_reports"]) == (["qa-e-0"], 0)


def test_reports_take_the_issue_of_their_dispatch_when_they_name_none(spark: SparkSession) -> None:
    log = Log().assign("1-0", "rc-1").work(vocab.WORK_STARTED, "1-0", "dev-e-0", 1)
    log.add(vocab.WORK_COMPLETED, entry="1-0", agent="dev-e", issue="rc-own", attempt=1)
    events = log.frame(spark)
    reports = rc.work_reports(events, facts(events)).orderBy("id").collect()
    assert [(r["issue_id"], r["worker"]) for r in reports] == [
        ("rc-1", "dev-e-0"),
        ("rc-own", "dev-e"),  # no consumer: the agent stands in
    ]


# ---------------------------------------------------------------------------------- statuses
# One log holds every status case, each on entries of its own: every Spark job costs seconds on
# two cores, so the frame is computed once for the module and each test reads its part.


def status_world() -> tuple[Log, list[tuple[str, str, str]], list[tuple[str, str, str, str]]]:
    log = Log()
    # completion: accepted (1-0) and fenced only (2-0)
    log.assign("1-0", "rc-1").work(vocab.WORK_STARTED, "1-0", "dev-e-0", 1)
    log.work(vocab.WORK_COMPLETED, "1-0", "dev-e-0", 1)
    log.assign("2-0", "rc-2").work(vocab.WORK_STARTED, "2-0", "dev-e-0", 1)
    log.work(vocab.WORK_COMPLETED, "2-0", "dev-e-0", 1, fenced=True)
    # dead letters: logged (3-0), only in the DLQ (4-0), a DLQ neighbour on another stream (5-0)
    log.assign("3-0", "rc-3").add(
        vocab.DEAD_LETTERED, entry="3-0", issue="rc-3", detail={"dlqId": "50-0"}
    )
    log.assign("4-0", "rc-4").assign("5-0", "rc-5")
    # pending: in a PEL after a failure (6-0), undelivered (7-0), neither (8-0)
    log.assign("6-0", "rc-6").work(vocab.WORK_STARTED, "6-0", "c-0", 1)
    log.work(vocab.WORK_FAILED, "6-0", "c-0", 1).assign("7-0", "rc-7").assign("8-0", "rc-8")
    # precedence: completed + dead-lettered + pending (9-0), dead-lettered + pending (10-0)
    log.assign("9-0", "rc-9").work(vocab.WORK_COMPLETED, "9-0", "c-0", 1)
    log.add(vocab.DEAD_LETTERED, entry="9-0", detail={"dlqId": "51-0"})
    log.assign("10-0", "rc-10").add(vocab.DEAD_LETTERED, entry="10-0", detail={"dlqId": "52-0"})
    # requeues: a runtime letter (11-0, no trace but the requeue to 31-0); a logged letter of
    # rc-12 (12-0) requeued to 32-0; another entry of rc-12, really lost (13-0)
    log.assign("11-0", "rc-11").assign("12-0", "rc-12")
    log.add(vocab.DEAD_LETTERED, entry="12-0", issue="rc-12", detail={"dlqId": "53-0"})
    log.assign("13-0", "rc-12")
    log.add(vocab.DEAD_LETTER_REQUEUED, entry="31-0", issue="rc-11", detail={"dlqId": "40-0"})
    log.add(vocab.DEAD_LETTER_REQUEUED, entry="32-0", issue="rc-12", detail={"dlqId": "53-0"})
    # another stream, and ids whose text order is not their stream order
    log.assign("1-0", "rc-s2-1", stream=S2).work(vocab.WORK_COMPLETED, "1-0", "c-0", 1, stream=S2)
    log.assign("1-1", "rc-s2-2", stream=S2)
    log.assign("100-0", "rc-100").assign("99-5", "rc-99")
    pending = [
        (S, "6-0", vocab.IN_PEL),
        (S, "7-0", vocab.UNDELIVERED),
        (S, "9-0", vocab.IN_PEL),
        (S, "10-0", vocab.IN_PEL),
        (S, "32-0", vocab.UNDELIVERED),
    ]
    letters = [(S, "60-0", "4-0", "rc-4"), (S2, "61-0", "5-0", "rc-5")]
    return log, pending, letters


@dataclass
class StatusWorld:
    by_entry: dict[tuple[str, str], Row]
    lost: list[Row]
    totals: Row
    rates: list[Row]

    def __getitem__(self, entry: str) -> Row:
        return self.by_entry[(S, entry)]


# The requeue correction is joined either way (the audit broadcasts it when requeues are few):
# every status test runs on both.
@pytest.fixture(scope="module", params=[False, True], ids=["shuffled", "broadcast"])
def world(spark: SparkSession, request: pytest.FixtureRequest) -> StatusWorld:
    log, pending, letters = status_world()
    events = log.frame(spark)
    dead = rc.dead_letters(events, dlq_frame(spark, *letters))
    status = rc.entry_status(
        facts(events),
        dead,
        pending_frame(spark, *pending),
        rc.unmatched_requeues(events),
        broadcast_matches=request.param,
    ).cache()
    totals = tallies.totals(status).first()
    assert totals is not None
    return StatusWorld(
        by_entry={(r["stream"], r["entry_id"]): r for r in status.collect()},
        lost=tallies.lost(status).collect(),
        totals=totals,
        rates=tallies.dead_letter_rate(status).collect(),
    )


def test_an_accepted_completion_completes_and_a_fenced_one_does_not(world: StatusWorld) -> None:
    assert world["1-0"]["status"] == vocab.COMPLETED
    assert world["1-0"]["completed_by"] == ["dev-e-0"]
    assert world["2-0"]["status"] == vocab.LOST
    assert world["2-0"]["fenced_reports"] == 1


def test_dead_letters_count_from_the_log_and_from_the_dlq(world: StatusWorld) -> None:
    assert (world["3-0"]["status"], world["3-0"]["dead_letter_sources"]) == (
        vocab.DEAD,
        ["event-log"],
    )
    assert (world["4-0"]["status"], world["4-0"]["dead_letter_sources"]) == (vocab.DEAD, ["dlq"])
    # A letter's time is its DLQ id's.
    assert world["4-0"]["dead_lettered_at"].astimezone(UTC) == datetime.fromtimestamp(0.06, UTC)
    assert world["5-0"]["status"] == vocab.LOST


def test_pending_means_in_a_pel_or_not_yet_delivered(world: StatusWorld) -> None:
    assert world["6-0"]["status"] == vocab.PENDING
    assert (world["6-0"]["pending_consumers"], world["6-0"]["last_report_kind"]) == (
        ["c-0"],
        vocab.WORK_FAILED,
    )
    assert (world["7-0"]["status"], world["7-0"]["pending_states"]) == (
        vocab.PENDING,
        [vocab.UNDELIVERED],
    )
    assert world["8-0"]["status"] == vocab.LOST  # acked, trimmed or deleted without a completion


def test_completed_outranks_dead_lettered_and_dead_lettered_outranks_pending(
    world: StatusWorld,
) -> None:
    assert world["9-0"]["status"] == vocab.COMPLETED
    assert world["10-0"]["status"] == vocab.DEAD


def test_a_requeued_runtime_letter_marks_its_original_dead_lettered(world: StatusWorld) -> None:
    assert (world["11-0"]["status"], world["11-0"]["dead_letter_sources"]) == (
        vocab.DEAD,
        ["requeue"],
    )
    # Finished when its letter was requeued: it no longer counts as outstanding after that.
    assert world["11-0"]["finished_at"] == world["11-0"]["dead_lettered_at"] is not None
    assert world["12-0"]["dead_letter_sources"] == ["event-log"]
    assert world["13-0"]["status"] == vocab.LOST  # the rc-12 requeue is explained by the log
    # Requeued entries are dispatched entries of their own, never their own originals.
    assert (world["31-0"]["origin"], world["31-0"]["status"]) == ("requeued", vocab.LOST)
    assert (world["32-0"]["origin"], world["32-0"]["status"]) == ("requeued", vocab.PENDING)


def test_lost_lists_only_lost_entries_in_stream_order(world: StatusWorld) -> None:
    assert [(r["stream"], r["entry_id"]) for r in world.lost] == [
        (S2, "1-1"),
        (S, "2-0"),
        (S, "5-0"),
        (S, "8-0"),
        (S, "13-0"),
        (S, "31-0"),
        (S, "99-5"),
        (S, "100-0"),
    ]
    assert {r["issue_id"] for r in world.lost if r["entry_id"] == "13-0"} == {"rc-12"}


def test_totals_partition_the_dispatched_entries(world: StatusWorld) -> None:
    assert world.totals.asDict() == {
        "dispatched": 19,
        "requeued": 2,
        "completed": 3,
        "dead_lettered": 5,
        "pending": 3,
        "lost": 8,
        "pending_in_pel": 1,
        "pending_undelivered": 2,
        "dead_lettered_logged": 3,
        "dead_lettered_outside_log": 2,
        "completed_still_pending": 1,
    }


def test_dead_letter_rate_per_stream(world: StatusWorld) -> None:
    rows = [
        (r["stream"], r["dispatched"], r["dead_lettered"], r["lost"], r["dead_letter_rate"])
        for r in world.rates
    ]
    assert rows == [(S2, 2, 0, 1, 0.0), (S, 17, 5, 7, pytest.approx(5 / 17))]


def test_pending_over_time_is_dispatched_minus_finished(spark: SparkSession) -> None:
    # (dispatched_at, finished_at): the only columns of the status frame the rule reads.
    status = spark.createDataFrame(
        [(at(5), at(25)), (at(15), at(47)), (at(16), None)],
        "dispatched_at timestamp, finished_at timestamp",
    )
    rows = timelines.pending_over_time(status, bucket_ms=10_000).collect()
    assert [
        (r["bucket_start"].astimezone(UTC), r["dispatched"], r["finished"], r["outstanding"])
        for r in rows
    ] == [
        (at(0), 1, 0, 1),
        (at(10), 2, 0, 3),
        (at(20), 0, 1, 2),
        (at(40), 0, 1, 1),
    ]


# -------------------------------------------------------------------------------- duplicates
# Likewise one log, one issue per case.


def duplicate_world() -> Log:
    log = Log()
    # rc-a: dispatched twice, completed by two consumers
    log.assign("1-0", "rc-a").assign("2-0", "rc-a")
    log.work(vocab.WORK_COMPLETED, "1-0", "dev-e-0", 1).work(
        vocab.WORK_COMPLETED, "2-0", "qa-e-0", 1
    )
    # rc-b: a retried report from the same consumer
    log.assign("3-0", "rc-b").work(vocab.WORK_STARTED, "3-0", "dev-e-0", 1)
    log.work(vocab.WORK_COMPLETED, "3-0", "dev-e-0", 1).work(
        vocab.WORK_COMPLETED, "3-0", "dev-e-0", 1
    )
    # rc-c: reclaimed from qa-e-0 (attempt 2 reserved): its completion is fenced before the new
    # attempt starts, so nothing ran twice, and a refused completion completes nothing
    log.assign("4-0", "rc-c").work(vocab.WORK_STARTED, "4-0", "qa-e-0", 1)
    log.work(vocab.WORK_COMPLETED, "4-0", "qa-e-0", 1, fenced=True)
    log.work(vocab.WORK_STARTED, "4-0", "dev-e-0", 2).work(
        vocab.WORK_COMPLETED, "4-0", "dev-e-0", 2
    )
    # rc-d: the zombie's completion, refused, after the newer attempt started
    log.assign("5-0", "rc-d").work(vocab.WORK_STARTED, "5-0", "ops-e-0", 1)
    log.work(vocab.WORK_STARTED, "5-0", "dev-e-0", 2)
    log.work(vocab.WORK_COMPLETED, "5-0", "ops-e-0", 1, fenced=True)
    log.work(vocab.WORK_COMPLETED, "5-0", "dev-e-0", 2)
    # rc-e: an accepted (unfenced) failure report of the older attempt, after the newer start
    log.assign("6-0", "rc-e").work(vocab.WORK_STARTED, "6-0", "ops-e-0", 1)
    log.work(vocab.WORK_STARTED, "6-0", "dev-e-0", 2).work(vocab.WORK_FAILED, "6-0", "ops-e-0", 1)
    # rc-f: the older attempt finished before the newer one started
    log.assign("7-0", "rc-f").work(vocab.WORK_STARTED, "7-0", "dev-e-0", 1)
    log.work(vocab.WORK_FAILED, "7-0", "dev-e-0", 1)
    log.work(vocab.WORK_STARTED, "7-0", "dev-e-0", 2).work(
        vocab.WORK_COMPLETED, "7-0", "dev-e-0", 2
    )
    # rc-g: a refused start (it claimed an outdated attempt) starts nothing
    log.assign("8-0", "rc-g").work(vocab.WORK_STARTED, "8-0", "ops-e-0", 1)
    log.work(vocab.WORK_STARTED, "8-0", "qa-e-0", 3, fenced=True)
    log.work(vocab.WORK_COMPLETED, "8-0", "ops-e-0", 1)
    # rc-h: both rules on one issue
    log.assign("9-0", "rc-h").work(vocab.WORK_STARTED, "9-0", "ops-e-0", 1)
    log.work(vocab.WORK_STARTED, "9-0", "dev-e-0", 2).work(
        vocab.WORK_COMPLETED, "9-0", "dev-e-0", 2
    )
    log.work(vocab.WORK_COMPLETED, "9-0", "ops-e-0", 1, fenced=True)
    log.assign("10-0", "rc-h").work(vocab.WORK_COMPLETED, "10-0", "qa-e-0", None)
    # rc-i: Redis lost 11-0 while ops-e-0 had it in hand; the dispatch was appended again as
    # 12-0 and the lost entry superseded, so the holder's late completion is fenced: it ran
    # twice (allowed), but only one completion counts and no attempt of one entry overlapped
    log.assign("11-0", "rc-i").work(vocab.WORK_STARTED, "11-0", "ops-e-0", 1)
    log.add(vocab.ISSUE_ASSIGNED, entry="12-0", issue="rc-i", agent="dev-e",
            detail={"idempotencyKey": "rc-i", "replaces": "11-0"})  # fmt: skip
    log.work(vocab.WORK_STARTED, "12-0", "dev-e-0", 1)
    log.work(vocab.WORK_COMPLETED, "11-0", "ops-e-0", 1, fenced=True, issue="rc-i")
    log.work(vocab.WORK_COMPLETED, "12-0", "dev-e-0", 1)
    return log


@dataclass
class DuplicateWorld:
    duplicates: dict[str | None, Row]
    overlaps: dict[str, Row]


@pytest.fixture(scope="module")
def dupes(spark: SparkSession) -> DuplicateWorld:
    events = duplicate_world().frame(spark)
    found = facts(events).cache()
    reports = rc.work_reports(events, found).cache()
    overlaps = duplicates.overlapping_attempts(reports, rc.reattempted(found)).cache()
    return DuplicateWorld(
        duplicates={
            r["issue_id"]: r
            for r in duplicates.duplicates(
                reports, overlaps, duplicates.completed_by_several(reports)
            ).collect()
        },
        overlaps={r["entry_id"]: r for r in overlaps.collect()},
    )


def test_an_issue_completed_by_two_consumers_is_a_duplicate(dupes: DuplicateWorld) -> None:
    found = dupes.duplicates["rc-a"]
    assert (found["consumers"], found["reasons"]) == (
        ["dev-e-0", "qa-e-0"],
        [vocab.BY_SEVERAL_CONSUMERS],
    )
    assert sorted(e["entry_id"] for e in found["entries"]) == ["1-0", "2-0"]


def test_repeated_or_refused_completions_are_not_duplicates(dupes: DuplicateWorld) -> None:
    assert "rc-b" not in dupes.duplicates
    assert "rc-c" not in dupes.duplicates
    assert "rc-i" not in dupes.duplicates  # a lost entry's holder, fenced


def test_an_older_attempt_reporting_after_a_newer_start_is_a_duplicate(
    dupes: DuplicateWorld,
) -> None:
    for issue in ("rc-d", "rc-e"):
        found = dupes.duplicates[issue]
        assert (found["consumers"], found["reasons"]) == (
            ["dev-e-0", "ops-e-0"],
            [vocab.OVERLAPPING_ATTEMPTS],
        )
    zombie = dupes.overlaps["5-0"]
    assert (zombie["older_attempt"], zombie["older_fenced"], zombie["newer_attempt"]) == (
        1,
        True,
        2,
    )
    assert (zombie["older_kind"], zombie["newer_worker"]) == (vocab.WORK_COMPLETED, "dev-e-0")


def test_an_older_attempt_that_finished_before_the_newer_start_is_no_overlap(
    dupes: DuplicateWorld,
) -> None:
    assert "rc-f" not in dupes.duplicates
    assert "rc-g" not in dupes.duplicates
    assert sorted(dupes.overlaps) == ["5-0", "6-0", "9-0"]


def test_both_rules_on_one_issue_merge_into_one_duplicate(dupes: DuplicateWorld) -> None:
    found = dupes.duplicates["rc-h"]
    assert found["consumers"] == ["dev-e-0", "ops-e-0", "qa-e-0"]
    assert found["reasons"] == [vocab.BY_SEVERAL_CONSUMERS, vocab.OVERLAPPING_ATTEMPTS]
    assert sorted(dupes.duplicates) == ["rc-a", "rc-d", "rc-e", "rc-h"]


# ---------------------------------------------------------------------------------- reclaims


def reclaim(log: Log, *, latency_ms: float | None, when: datetime, **fields: Any) -> Log:
    beat = None if latency_ms is None else (when - timedelta(milliseconds=latency_ms)).isoformat()
    detail = {"toConsumer": "dev-e-0", "toAgent": "dev-e", "lastHeartbeatAt": beat}
    return log.add(
        vocab.RECLAIMED,
        when=when,
        consumer="ops-e-0",
        agent="ops-e",
        group="g",
        detail={**detail, **fields.pop("detail", {})},
        **fields,
    )


def test_reclaim_latency_is_the_reclaim_time_minus_the_last_heartbeat(spark: SparkSession) -> None:
    log = Log()
    reclaim(log, latency_ms=1_000, when=at(100), entry="1-0", detail={"idleMs": 5, "deliveries": 2})
    reclaim(log, latency_ms=2_000, when=at(200), entry="2-0")
    reclaim(log, latency_ms=4_000.5, when=at(300), entries=["3-0", "4-0"])  # one batch row
    reclaim(log, latency_ms=None, when=at(400), entry="5-0")  # the owner never heartbeated
    rows = {r["entry_id"]: r for r in timelines.reclaims(log.frame(spark)).collect()}
    assert sorted(rows) == ["1-0", "2-0", "3-0", "4-0", "5-0"]
    assert rows["1-0"]["latency_ms"] == 1_000.0
    assert (rows["1-0"]["idle_ms"], rows["1-0"]["deliveries"]) == (5, 2)
    assert rows["4-0"]["latency_ms"] == 4_000.5
    assert (rows["4-0"]["to_consumer"], rows["4-0"]["from_consumer"]) == ("dev-e-0", "ops-e-0")
    assert rows["5-0"]["latency_ms"] is None
    stats = timelines.reclaim_latency(timelines.reclaims(log.frame(spark))).first()
    assert stats is not None
    # 1000, 2000, 4000.5, 4000.5: linear interpolation between closest ranks.
    assert (stats["reclaims"], stats["measured"]) == (5, 4)
    assert stats["p50"] == pytest.approx(3_000.25)
    assert stats["p95"] == pytest.approx(4_000.5)
    assert stats["max"] == pytest.approx(4_000.5)


def test_reclaims_are_counted_by_reason(spark: SparkSession) -> None:
    log = Log()
    for n, reason in enumerate(["degraded", "degraded", "stalled", "manual", "down", "pod-gone"]):
        reclaim(log, latency_ms=None, when=at(n), entry=f"{n}-0", detail={"reason": reason})
    # Rows from before reasons were recorded: pod-gone when the pod was gone, else down.
    reclaim(log, latency_ms=None, when=at(9), entry="9-0", detail={"reasons": ["pod-gone"]})
    reclaim(log, latency_ms=None, when=at(10), entry="10-0", detail={"reasons": ["x"]})
    counts = {
        r["reason"]: r["reclaims"]
        for r in timelines.reclaims_by_reason(timelines.reclaims(log.frame(spark))).collect()
    }
    assert counts == {"degraded": 2, "down": 2, "manual": 1, "pod-gone": 2, "stalled": 1}


def test_reclaim_latency_without_reclaims_is_null(spark: SparkSession) -> None:
    log = Log().assign("1-0", "rc-1")
    stats = timelines.reclaim_latency(timelines.reclaims(log.frame(spark))).first()
    assert stats is not None
    assert (stats["reclaims"], stats["measured"], stats["p50"], stats["max"]) == (0, 0, None, None)


def test_the_latency_histogram_counts_every_measured_reclaim(spark: SparkSession) -> None:
    log = Log()
    for n, latency in enumerate((100.0, 150.0, 900.0, 1_000.0, None)):
        reclaim(log, latency_ms=latency, when=at(10 * n + 10), entry=f"{n}-0")
    bins = timelines.latency_histogram(timelines.reclaims(log.frame(spark)), bins=9).collect()
    assert sum(b["count"] for b in bins) == 4
    assert bins[0]["bin_start_ms"] == pytest.approx(100.0)
    assert (bins[0]["count"], bins[-1]["bin"], bins[-1]["count"]) == (2, 8, 2)


# ------------------------------------------------------------------------------ availability


def beats(log: Log, agent: str, minutes: Sequence[float]) -> Log:
    for minute in minutes:
        log.add(vocab.HEARTBEAT, when=T0 + timedelta(minutes=minute), agent=agent, stream=None)
    return log


def test_gaps_longer_than_the_threshold_count_as_down_time(spark: SparkSession) -> None:
    log = Log()
    beats(log, "flaky", [0, 5, 25, 30])  # 20 min gap; the last one (to 40) is exactly 10 min
    beats(log, "steady", [0, 9, 18, 27, 36])
    beats(log, "gone", [0, 2])  # silent for the last 38 minutes
    beats(log, "late", [0, 30, 50])  # the beat at 50 is after the window's end
    gaps = timelines.heartbeat_gaps(log.frame(spark), window_end=T0 + timedelta(minutes=40)).cache()
    rows = {r["agent_id"]: r for r in timelines.availability(gaps, down_ms=10 * MINUTE).collect()}
    flaky = rows["flaky"]
    assert flaky["observed_ms"] == 40 * MINUTE
    assert flaky["down_ms"] == 20 * MINUTE
    assert flaky["detected_down_ms"] == 10 * MINUTE
    assert (flaky["down_periods"], flaky["down_at_end"]) == (1, False)
    assert flaky["availability"] == pytest.approx(0.5)
    assert (rows["steady"]["availability"], rows["steady"]["down_periods"]) == (1.0, 0)
    assert rows["gone"]["down_at_end"] is True
    assert rows["gone"]["availability"] == pytest.approx(2 / 40)
    late = rows["late"]
    assert (late["heartbeats"], late["observed_ms"], late["down_ms"]) == (
        2,
        40 * MINUTE,
        30 * MINUTE,
    )
    periods = timelines.down_periods(gaps, down_ms=10 * MINUTE).collect()
    assert [(p["agent_id"], p["duration_ms"], p["still_down"]) for p in periods] == [
        ("flaky", 20 * MINUTE, False),
        ("gone", 38 * MINUTE, True),
        ("late", 30 * MINUTE, False),
    ]
    assert periods[0]["down_from"].astimezone(UTC) == T0 + timedelta(minutes=5)


def test_liveness_intervals_give_the_same_availability_as_their_beats(
    spark: SparkSession,
) -> None:
    """The same heartbeats, once as HEARTBEAT events and once as the liveness intervals the
    conductor keeps now (a gap longer than the break ends one); a legacy beat before the
    intervals and an interval still open at the window's end take part too."""
    window_end = T0 + timedelta(minutes=40)
    as_events = beats(Log(), "flaky", [0, 5, 25, 30]).frame(spark)

    def stretch(start: float, end: float, n: int) -> tuple[str, datetime, datetime, int]:
        return ("flaky", T0 + timedelta(minutes=start), T0 + timedelta(minutes=end), n)

    intervals = spark.createDataFrame(
        [stretch(5, 5, 1), stretch(25, 30, 2)], vocab.INTERVALS_SCHEMA
    )
    legacy = beats(Log(), "flaky", [0]).frame(spark)
    expected = timelines.availability(
        timelines.heartbeat_gaps(as_events, window_end=window_end), down_ms=10 * MINUTE
    ).collect()
    found = timelines.availability(
        timelines.heartbeat_gaps(legacy, intervals, window_end=window_end), down_ms=10 * MINUTE
    ).collect()
    assert found == expected
    assert found[0]["heartbeats"] == 4 and found[0]["down_periods"] == 1

    # Overlapping intervals (two replicas ended the same stretch) leave no gap and no double
    # time; an interval that runs past the window's end is cut there.
    overlapping = spark.createDataFrame(
        [stretch(0, 20, 5), stretch(10, 20, 5), stretch(35, 60, 3)], vocab.INTERVALS_SCHEMA
    )
    empty = Log().frame(spark)
    (row,) = timelines.availability(
        timelines.heartbeat_gaps(empty, overlapping, window_end=window_end), down_ms=10 * MINUTE
    ).collect()
    assert (row["observed_ms"], row["down_ms"], row["down_periods"]) == (
        40 * MINUTE,
        15 * MINUTE,
        1,
    )
    assert row["down_at_end"] is False


# ------------------------------------------------------------------ per-stream and over time


def test_detector_sightings_are_counted_per_consumer(spark: SparkSession) -> None:
    log = Log()
    for _ in range(3):
        log.add(vocab.CONSUMER_WITHOUT_HEARTBEAT, consumer="x-0", group="g", detail={"pending": 2})
    log.add(vocab.CONSUMER_WITHOUT_HEARTBEAT, consumer="y-0", group="g")
    rows = timelines.detector_sightings(log.frame(spark)).collect()
    assert [(r["consumer"], r["sightings"]) for r in rows] == [("x-0", 3), ("y-0", 1)]


def test_per_entry_unrolls_rows_about_several_entries(spark: SparkSession) -> None:
    log = Log().add(vocab.RECLAIMED, entries=["1-0", "2-0"]).add(vocab.RECLAIMED, entry="3-0")
    rows = rc.per_entry(log.frame(spark)).collect()
    assert sorted((r["id"], r["entry_id"]) for r in rows) == [(1, "1-0"), (1, "2-0"), (2, "3-0")]


# ---------------------------------------------------------------- plain helpers (no Spark)


@pytest.mark.parametrize(
    ("span_ms", "bucket"),
    [(0, 1_000), (120_000, 1_000), (121_000, 5_000), (3_600_000, 30_000), (1e12, 7 * 86_400_000)],
)
def test_choose_bucket_ms(span_ms: float, bucket: int) -> None:
    assert timelines.choose_bucket_ms(span_ms) == bucket


@pytest.mark.parametrize(
    ("url", "jdbc", "properties"),
    [
        (
            "postgresql+psycopg://postgres@127.0.0.1:5432/rig",
            "jdbc:postgresql://127.0.0.1:5432/rig?prepareThreshold=0",
            {"user": "postgres"},
        ),
        (
            "postgresql://u:p%40ss@db.example:6543/rig?sslmode=require&application_name=x",
            "jdbc:postgresql://db.example:6543/rig?prepareThreshold=0",
            {"user": "u", "password": "p@ss", "sslmode": "require", "ApplicationName": "x"},
        ),
        (
            "postgresql+psycopg://u@[::1]/rig",
            "jdbc:postgresql://[::1]:5432/rig?prepareThreshold=0",
            {"user": "u"},
        ),
    ],
)
def test_jdbc_source_from_the_database_url(url: str, jdbc: str, properties: dict[str, str]) -> None:
    source = sources.jdbc_source(url)
    assert source.url == jdbc
    assert source.properties["driver"] == "org.postgresql.Driver"
    assert {k: source.properties[k] for k in properties} == properties
    assert "p@ss" not in source.url


def test_a_unix_socket_database_url_is_refused_in_one_line() -> None:
    with pytest.raises(sources.SourceError, match=r"^RIG_DATABASE_URL: .*TCP"):
        sources.jdbc_source("postgresql+psycopg://postgres@/rig?host=/tmp/pg")


def test_event_filter_quotes_literals_and_bounds_the_window() -> None:
    where = sources.event_filter(
        tenant="o'brien",
        since=datetime(2025, 1, 1, tzinfo=UTC),
        until=datetime(2025, 1, 2, 1, 0, tzinfo=UTC) + timedelta(hours=0),
        up_to_id=42,
        kinds=("WORK_COMPLETED",),
    )
    assert where == (
        "tenant = 'o''brien' AND occurred_at >= TIMESTAMPTZ '2025-01-01T00:00:00+00:00' "
        "AND occurred_at < TIMESTAMPTZ '2025-01-02T01:00:00+00:00' AND id <= 42 "
        "AND kind IN ('WORK_COMPLETED')"
    )


@pytest.mark.parametrize(
    ("rows", "parallelism", "partitions"),
    [(0, 2, 1), (200_000, 2, 1), (1_000_000, 2, 4), (5_000_000, 2, 4), (5_000_000, 8, 16)],
)
def test_partitions_for(rows: int, parallelism: int, partitions: int) -> None:
    assert sources.partitions_for(rows, parallelism=parallelism) == partitions


def test_instants_without_an_offset_are_utc() -> None:
    assert audit_main.parse_instant("2025-01-01T10:00") == datetime(2025, 1, 1, 10, tzinfo=UTC)
    assert audit_main.parse_instant("2025-01-01T10:00:00+02:00") == datetime(
        2025, 1, 1, 8, tzinfo=UTC
    )


@pytest.mark.parametrize(("master", "partitions"), [("local[2]", 4), ("local[4]", 8), ("local", 4)])
def test_local_shuffle_partitions(master: str, partitions: int) -> None:
    assert audit_session.local_shuffle_partitions(master) == partitions


def test_a_failure_is_described_in_one_line() -> None:
    assert audit_session.describe(ValueError("first\nsecond")) == "ValueError: first"


# ------------------------------------------------------------------------ staged outputs


def test_a_completion_counts_only_once_its_staged_outputs_are_published(
    spark: SparkSession,
) -> None:
    """Nothing is claimed for outputs nobody published: 1-0's accepted completion named staged
    files and its WORK_PUBLISHED came; 2-0's never did (its agent died, the entry was acked
    elsewhere): lost. 3-0's were found nowhere: voided, attempt 2 ran and published: completed
    by the second consumer only, not a duplicate. 4-0 staged nothing (an agent of 0.1)."""
    outputs = {"outputs": 1}
    log = (
        Log()
        .assign("1-0", "rc-1").work(vocab.WORK_STARTED, "1-0", "dev-e-0", 1)
        .add(vocab.WORK_COMPLETED, entry="1-0", consumer="dev-e-0", attempt=1, detail=outputs)
        .add(vocab.WORK_PUBLISHED, entry="1-0", consumer="dev-e-1", attempt=1, detail={})
        .assign("2-0", "rc-2").work(vocab.WORK_STARTED, "2-0", "dev-e-0", 1)
        .add(vocab.WORK_COMPLETED, entry="2-0", consumer="dev-e-0", attempt=1, detail=outputs)
        .assign("3-0", "rc-3").work(vocab.WORK_STARTED, "3-0", "dev-e-0", 1)
        .add(vocab.WORK_COMPLETED, entry="3-0", consumer="dev-e-0", attempt=1, detail=outputs)
        .add(vocab.WORK_PUBLISHED, entry="3-0", consumer="qa-e-0", attempt=1,
             detail={"missing": ["/out/rc-3.json"]})
        .work(vocab.WORK_STARTED, "3-0", "qa-e-0", 2)
        .add(vocab.WORK_COMPLETED, entry="3-0", consumer="qa-e-0", attempt=2, detail=outputs)
        .add(vocab.WORK_PUBLISHED, entry="3-0", consumer="qa-e-0", attempt=2, detail={})
        .assign("4-0", "rc-4").work(vocab.WORK_STARTED, "4-0", "dev-e-0", 1)
        .work(vocab.WORK_COMPLETED, "4-0", "dev-e-0", 1)
    )  # fmt: skip
    events = log.frame(spark)
    unpublished = {
        (r["entry_id"], r["attempt"]) for r in rc.unpublished_completions(events).collect()
    }
    assert unpublished == {("2-0", 1), ("3-0", 1)}
    found = facts(events)
    status = rc.entry_status(
        found,
        rc.dead_letters(events, dlq_frame(spark)),
        pending_frame(spark),
        rc.unmatched_requeues(events),
        broadcast_matches=True,
    )
    by_entry = {r["entry_id"]: r for r in status.collect()}
    assert {e: r["status"] for e, r in by_entry.items()} == {
        "1-0": vocab.COMPLETED,
        "2-0": vocab.LOST,
        "3-0": vocab.COMPLETED,
        "4-0": vocab.COMPLETED,
    }
    assert by_entry["3-0"]["completed_by"] == ["qa-e-0"]
    reports = rc.work_reports(events, found)
    assert duplicates.completed_by_several(reports).collect() == []


def test_groups_fanning_out_each_complete_their_own_work_once(spark: SparkSession) -> None:
    """Work is owned per group: `workers` and `auditors` each completing rc-1's entry is not
    work done twice, nor is an attempt of one group overlapping the other's; two consumers
    completing it within `workers` is."""
    log = Log().assign("1-0", "rc-1").assign("2-0", "rc-2")
    for group, consumer in (("workers", "dev-e-0"), ("auditors", "qa-e-0")):
        log.add(vocab.WORK_STARTED, entry="1-0", consumer=consumer, attempt=1, group=group)
    log.add(vocab.WORK_STARTED, entry="1-0", consumer="dev-e-1", attempt=2, group="workers")
    log.add(vocab.WORK_COMPLETED, entry="1-0", consumer="qa-e-0", attempt=1, group="auditors")
    log.add(vocab.WORK_COMPLETED, entry="1-0", consumer="dev-e-1", attempt=2, group="workers")
    for consumer, attempt in (("dev-e-0", 1), ("dev-e-1", 2)):
        log.add(
            vocab.WORK_STARTED, entry="2-0", consumer=consumer, attempt=attempt, group="workers"
        )
        log.add(
            vocab.WORK_COMPLETED, entry="2-0", consumer=consumer, attempt=attempt, group="workers"
        )
    events = log.frame(spark)
    found = facts(events)
    reports = rc.work_reports(events, found)
    overlaps = duplicates.overlapping_attempts(reports, rc.reattempted(found))
    several = duplicates.completed_by_several(reports)
    dupes = duplicates.duplicates(reports, overlaps, several).collect()
    assert [(d["issue_id"], d["consumers"]) for d in dupes] == [("rc-2", ["dev-e-0", "dev-e-1"])]
