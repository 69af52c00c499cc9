"""Log output: the same sentence in both formats; JSON carries the parts as fields."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import sys
import threading
import time
from collections.abc import Sequence

import pytest

from rig_conductor import logs


def _capture(log_format: str) -> tuple[logging.Logger, io.StringIO]:
    config = logs.config(log_format)
    stream = io.StringIO()
    config["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(config)
    return logging.getLogger(logs.RECLAIM_LOGGER), stream


def test_json_lines_carry_message_and_fields() -> None:
    logger, stream = _capture("json")
    logger.info(
        "[StreamReclaim] Reclaimed %s on %s: %s -> %s",
        "1-0",
        "rig:dispatch",
        "a-0",
        "b-0",
        extra={
            "entryId": "1-0",
            "stream": "rig:dispatch",
            "fromConsumer": "a-0",
            "toConsumer": "b-0",
        },
    )
    line = json.loads(stream.getvalue())
    assert line["message"] == "[StreamReclaim] Reclaimed 1-0 on rig:dispatch: a-0 -> b-0"
    assert line["level"] == "INFO"
    assert (line["entryId"], line["stream"], line["fromConsumer"], line["toConsumer"]) == (
        "1-0",
        "rig:dispatch",
        "a-0",
        "b-0",
    )
    assert "args" not in line and "msg" not in line


def test_text_lines_end_with_the_sentence() -> None:
    logger, stream = _capture("text")
    logger.info("[StreamReclaim] Dead-lettered %s on %s after %d deliveries", "1-0", "s", 5)
    assert (
        stream.getvalue()
        .rstrip()
        .endswith("[StreamReclaim] Dead-lettered 1-0 on s after 5 deliveries")
    )


def _batch(n: int) -> logs.Lines:
    ids = [f"{i}-0" for i in range(n)]
    return logs.Lines(
        [f"[StreamReclaim] Reclaimed {i} on s: a-0 -> b-0" for i in ids],
        {"stream": "s", "fromConsumer": "a-0", "toConsumer": "b-0", "reason": "down"},
        ("entryId", ids),
    )


def test_a_batch_is_one_line_per_entry_in_text() -> None:
    logger, stream = _capture("text")
    logs.log_lines(logger, logging.INFO, _batch(3))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        assert line.endswith(
            f"INFO    rig_conductor.reaper.cycle: [StreamReclaim] Reclaimed {i}-0 on s: a-0 -> b-0"
        )


def test_a_batch_is_one_object_per_entry_in_json() -> None:
    logger, stream = _capture("json")
    logs.log_lines(logger, logging.INFO, _batch(3))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["entryId"] for line in lines] == ["0-0", "1-0", "2-0"]
    assert {line["reason"] for line in lines} == {"down"}
    assert lines[1]["message"] == "[StreamReclaim] Reclaimed 1-0 on s: a-0 -> b-0"
    assert "rig_lines" not in lines[0]


def test_a_batch_below_the_level_costs_nothing() -> None:
    logger, stream = _capture("text")
    logging.getLogger().setLevel(logging.WARNING)
    logs.log_lines(logger, logging.INFO, _batch(3))
    assert stream.getvalue() == ""


def test_a_foreign_formatter_still_gets_every_sentence() -> None:
    record = logging.LogRecord("x", logging.INFO, "", 0, "%s", (_batch(2),), None)
    assert logging.Formatter("%(message)s").format(record).splitlines() == [
        "[StreamReclaim] Reclaimed 0-0 on s: a-0 -> b-0",
        "[StreamReclaim] Reclaimed 1-0 on s: a-0 -> b-0",
    ]


# Ids, and a target consumer, holding what the text log must escape: a newline that would
# forge a `[StreamReclaim]` line, CR, ESC, DEL, C1 (NEL), U+2028, a tab; and what it must not.
FORGED = (
    "\n2026-11-26 10:00:00,000 INFO    rig_conductor.reaper.cycle: [StreamReclaim] Reclaimed 9-9"
)
CONTROL_IDS = ["1-0", 'x"\\\u00e9\U0001f600\n-0', "\r\x1b[2J\x85\u2028\x7f\t\x00-0", FORGED]


def _record(
    message: str, fields: dict[str, object], args: tuple[object, ...] = ()
) -> logging.LogRecord:
    record = logging.LogRecord("t", logging.INFO, "", 0, message, args, None)
    record.__dict__.update(fields)
    record.created, record.msecs = 1_764_000_000.25, 250.0  # the same time for every path
    return record


@pytest.mark.parametrize("formatter", [logs.TextFormatter, logs.JsonFormatter])
@pytest.mark.parametrize("ids", [["1-0", "2-0", "3-0"], CONTROL_IDS])
@pytest.mark.parametrize("to", ["b-0", "b-0" + FORGED])
def test_framed_sentences_render_exactly_as_listed_ones(
    formatter: type[logging.Formatter], ids: list[str], to: str
) -> None:
    prefix, suffix = "[StreamReclaim] Reclaimed ", f' on s%s: a-0 -> "{to}"'
    common = {"stream": "s", "fromConsumer": "a-0", "reason": "down"}
    framed = logs.Framed(prefix, ids, suffix)
    listed = [prefix + i + suffix for i in ids]
    assert list(framed) == listed and len(framed) == len(ids) and framed[-1] == listed[-1]
    assert list(framed[1:]) == listed[1:]

    def render(messages: Sequence[str]) -> str:
        lines = logs.Lines(messages, common, ("entryId", ids))
        record = _record("%s", {"rig_lines": lines}, (lines,))
        return formatter().format(record)

    rendered = render(framed)
    assert rendered == render(listed)
    assert len(rendered.splitlines()) == len(ids)  # one line per entry, whatever the ids hold
    one_by_one = [
        formatter().format(_record(m, {**common, "entryId": i}))
        for m, i in zip(listed, ids, strict=True)
    ]
    if formatter is logs.TextFormatter:  # byte for byte as a record of its own would read
        assert rendered == "\n".join(one_by_one)
        assert all(line.startswith("2025-") for line in rendered.splitlines())
    else:  # the same objects; the sentences and ids as they were
        assert [json.loads(line) for line in rendered.splitlines()] == [
            json.loads(line) for line in one_by_one
        ]
        assert [json.loads(line)["message"] for line in rendered.splitlines()] == listed


def test_the_text_log_escapes_control_characters_as_python_literals() -> None:
    assert logs.escape("plain \u00e9\U0001f600 \\n") == "plain \u00e9\U0001f600 \\n"
    assert logs.escape("a\nb\r\tc\x1b[0m\x7f\x85\u2028\u2029\x00") == (
        "a\\nb\\r\\tc\\x1b[0m\\x7f\\x85\\u2028\\u2029\\x00"
    )


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_one_record_is_one_line_whatever_it_quotes(log_format: str) -> None:
    """A request path with a %0A, a consumer name from Redis, an error message, a traceback."""
    logger, stream = _capture(log_format)
    consumer = "dev-e-0" + FORGED
    logger.info("GET %s 404 1.0ms", "/api/agents" + FORGED)
    logger.warning("Consumer %s holds %d entries", consumer, 3, extra={"consumer": consumer})
    try:
        raise RuntimeError("refused:" + FORGED)
    except RuntimeError:
        logger.exception("Scan failed: %s", "refused:" + FORGED)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert all(line.startswith("20") or line.startswith("{") for line in lines)
    if log_format == "json":
        records = [json.loads(line) for line in lines]
        assert records[1]["consumer"] == consumer and records[1]["message"].endswith("3 entries")
        assert "RuntimeError: refused:" + FORGED in records[2]["exception"]
    else:
        assert lines[1].endswith("Consumer dev-e-0\\n2026-11-26 10:00:00,000 INFO    "
                                 "rig_conductor.reaper.cycle: [StreamReclaim] Reclaimed 9-9 "
                                 "holds 3 entries")  # fmt: skip
        assert "Traceback (most recent call last):\\n" in lines[2]
        assert lines[2].endswith("RuntimeError: refused:" + logs.escape(FORGED))


def test_framed_of_a_template_fills_the_parts_once_and_the_field_per_line() -> None:
    framed = logs.Framed.of(logs.RECLAIMED, "entryId", ["1-0", "2-0"], stream="s{x}",
                            fromConsumer="a-0", toConsumer="b-0")  # fmt: skip
    assert list(framed) == [
        "[StreamReclaim] Reclaimed 1-0 on s{x}: a-0 -> b-0",
        "[StreamReclaim] Reclaimed 2-0 on s{x}: a-0 -> b-0",
    ]
    with pytest.raises(ValueError, match=r"no \{dlqId\}"):
        logs.Framed.of(logs.RECLAIMED, "dlqId", ["1-0"])


def test_filled_lines_take_the_template_parts_from_the_common_fields() -> None:
    common = {"stream": "s", "fromConsumer": "a-0", "toConsumer": "b-0", "toAgent": None}
    lines = logs.Lines.filled(logs.RECLAIMED, "entryId", ["1-0", "2-0"], common)
    assert list(lines.messages) == [
        "[StreamReclaim] Reclaimed 1-0 on s: a-0 -> b-0",
        "[StreamReclaim] Reclaimed 2-0 on s: a-0 -> b-0",
    ]
    assert lines.common == common and lines.fields(1) == {**common, "entryId": "2-0"}


class _SlowStream(io.StringIO):
    """A stderr that takes a while per write, recording how many records were queued then."""

    def __init__(self, writer: logs._WriterThread) -> None:
        super().__init__()
        self.writer = writer
        self.queued: list[int] = []

    def write(self, text: str) -> int:
        self.queued.append(self.writer.records.qsize())
        time.sleep(0.001)  # a slow terminal
        return super().write(text)


def test_a_slow_stderr_slows_the_logger_instead_of_queueing_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = logs._WriterThread(logging.Formatter("%(message)s"))
    stream = _SlowStream(writer)
    monkeypatch.setattr(sys, "stderr", stream)
    records = 5 * logs.QUEUE_RECORDS
    for n in range(records):
        record = logging.LogRecord("t", logging.INFO, "", 0, "line %d", (n,), None)
        record.msg, record.args = record.getMessage(), None
        assert writer.put(record)  # waits for room: the stream keeps taking lines
    writer.stop()
    assert max(stream.queued) <= logs.QUEUE_RECORDS
    assert stream.getvalue().splitlines() == [f"line {n}" for n in range(records)]


def test_a_stderr_that_takes_nothing_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = threading.Event()

    class Stuck(io.StringIO):
        def write(self, text: str) -> int:
            stuck.wait()  # a full pipe nobody reads, until the test ends
            return 0

    monkeypatch.setattr(logs, "STALL_S", 0.3)
    monkeypatch.setattr(sys, "stderr", Stuck())
    writer = logs._WriterThread(logging.Formatter("%(message)s"))
    record = logging.LogRecord("t", logging.INFO, "", 0, "line", None, None)
    put: list[bool] = []
    putting = threading.Thread(
        target=lambda: put.extend(writer.put(record) for _ in range(logs.QUEUE_RECORDS + 5))
    )
    putting.start()
    putting.join(timeout=30)
    try:
        # Every put returned while stderr still took nothing: none waited for it.
        assert not putting.is_alive() and not stuck.is_set()
        assert put[: logs.QUEUE_RECORDS] == [True] * logs.QUEUE_RECORDS
        assert put[-1] is False  # dropped once stderr took nothing for STALL_S
    finally:
        stuck.set()
        putting.join()
        writer.stop()
