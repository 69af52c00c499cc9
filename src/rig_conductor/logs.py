"""Logging set-up: one dictConfig builder, text or JSON lines on stderr, and batches of lines.

In JSON format every record is one object whose `message` is the same sentence the text format
prints, with the `extra` fields a call passed (entryId, stream, fromConsumer, ...) beside it.

A scan that moves a million entries logs a million lines. Doing that one LogRecord at a time
costs more than the moves (a record, a formatter call, a flush and a write per line), so
`log_lines` sends a page of lines as one record: the formatters here render it as one line
per entry, each exactly as a record of its own would read, and the handler writes the page at
once. A page whose lines differ in one value only (`Framed`: the entry id of a move) is
rendered with one join, not a line at a time. In JSON, a batch is assembled from pieces encoded
once (`_json_lines`), not one `json.dumps` a line: 0.4 µs a line against 4.8 µs, measured on
the 2-core CI machine for 10,000 `[StreamReclaim]` lines (the same objects; tests/unit/test_logs
compares them). At 4.8 µs the writer thread alone would take most of the 6.7 µs an entry that
150,000 reclaims a second allow, sharing the GIL with the scan.

`configure` puts a bounded queue in front of stderr: the scan enqueues, a thread formats and
writes. A slow stderr slows the scan to its
pace (the queue holds at most QUEUE_RECORDS records, so memory stays flat at any volume); a
closed one costs nothing; one that takes nothing for STALL_S (a full pipe nobody reads) is
given up on, its lines dropped, and never stalls a scan or the exit for longer. The queue is
fed by the standard library's QueueHandler; it is drained by a thread of ours rather than a
QueueListener, whose stop() joins its thread with no bound: a stuck stderr would hang the exit.

One record is one line in the text format too, whatever it quotes: a request path, a consumer
name read from Redis, an error message or a traceback may hold a newline, and an unescaped one
would let whoever chose that text forge a line (a `[StreamReclaim]` line, say). So the text
formatter writes control characters as a Python literal would (`\\n`, `\\x1b`, `\\u2028`).
Checking costs one regex search per record or per batch; only text that holds one is rewritten.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import logging.config
import logging.handlers
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, overload

from rig_conductor.domain import CONTROL

# Attributes every LogRecord has; anything else on a record came in through `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
    "rig_lines",
}
# A str as JSON, exactly as json.dumps writes it, without building an encoder per call.
_quote = json.encoder.encode_basestring_ascii
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# The line of every moved entry (reaper rule 8, docs/rules.md), whoever moved it.
RECLAIMED = "[StreamReclaim] Reclaimed {entryId} on {stream}: {fromConsumer} -> {toConsumer}"
# The names of the loggers several modules write under, spelled once: operators filter on them.
# The reclaim lines keep the name they had when the scan wrote them all itself.
RECLAIM_LOGGER = "rig_conductor.reaper.cycle"  # [StreamReclaim] and the dead letters
LEADER_LOGGER = "rig_conductor.reaper.leader"  # the leader election and its leases
CONSOLE_LOGGER = "rig_conductor.console"  # what operators did and saw, by console or API
# The names the scan's other lines have always had, now that the write port writes them.
REDISPATCH_LOGGER = "rig_conductor.reaper.redispatch"  # dispatches Redis lost, appended again
HYGIENE_LOGGER = "rig_conductor.reaper.cleanup"  # [ConsumerHygiene]
REDIS_LOSS_LOGGER = "rig_conductor.reaper.redis_loss"  # Redis lost its data: the recovery
OBSERVE_LOGGER = "rig_conductor.reaper.observe"  # consumers without heartbeat, first seen
SWEEP_LOGGER = "rig_conductor.adapters.redis.sweep"  # a pending list or claim Redis refused
# How the text log writes each control character: short escapes where Python has them.
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PRINTABLE_ASCII = bytes(range(0x20, 0x7F))
STALL_S = 2.0  # how long a stderr that takes no line is waited for before it is given up on
QUEUE_RECORDS = 64  # records waiting for the writer: a page of up to 1,000 lines each


def escape(text: str) -> str:
    """`text` with its control characters escaped (`\\n`, `\\x1b`, `\\u2028`): on one line.
    Character by character, so the escaped parts of a text put together are the escaped whole."""
    return text if _clean(text) else CONTROL.sub(_escaped, text)


def _clean(text: str) -> bool:
    """Whether `text` holds no control character. ASCII text (entry ids, most names and
    messages; `isascii` is a flag lookup) takes one byte pass in C, ten times the regex's pace:
    this runs over every batch of a million-line scan."""
    if text.isascii():
        return not text.encode("ascii").translate(None, _PRINTABLE_ASCII)
    return CONTROL.search(text) is None


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


class Framed(Sequence[str]):
    """The sentences `prefix + value + suffix`, one per value: a batch whose lines differ in one
    value only. Read one by one they are built as they are read; the formatters here render the
    whole batch with one join instead."""

    __slots__ = ("prefix", "suffix", "values")

    def __init__(self, prefix: str, values: Sequence[str], suffix: str) -> None:
        self.prefix, self.values, self.suffix = prefix, values, suffix

    @classmethod
    def of(cls, template: str, field: str, values: Sequence[str], **parts: object) -> Framed:
        """`template` with `{<field>}` taking each of `values` and the other `{...}` `parts`."""
        prefix, found, suffix = template.partition("{" + field + "}")
        if not found:
            raise ValueError(f"{template!r} has no {{{field}}}")
        return cls(prefix.format(**parts), values, suffix.format(**parts))

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return Framed(self.prefix, self.values[index], self.suffix)
        return self.prefix + self.values[index] + self.suffix

    def __iter__(self) -> Iterator[str]:
        prefix, suffix = self.prefix, self.suffix
        return (prefix + value + suffix for value in self.values)

    def render(self, head: str) -> str:
        """Every sentence after `head`, a line each."""
        start = head + self.prefix
        return start + (self.suffix + "\n" + start).join(self.values) + self.suffix

    def escaped(self) -> Framed:
        """The same sentences with their control characters escaped (`escape`); itself when
        none holds one, as a move's lines never do: one search over the joined values."""
        if _clean("".join(self.values)) and _clean(self.prefix + self.suffix):
            return self
        values = [escape(value) for value in self.values]
        return Framed(escape(self.prefix), values, escape(self.suffix))


@dataclass(frozen=True, slots=True)
class Lines:
    """Many log lines sent as one record: `messages[i]` with the fields `common`, plus
    `varying[0]` = `varying[1][i]` (the one field that differs from line to line)."""

    messages: Sequence[str]
    common: Mapping[str, Any]
    varying: tuple[str, Sequence[Any]] | None = None

    def __str__(self) -> str:  # what a formatter that does not know batches shows
        return "\n".join(self.messages)

    @classmethod
    def filled(
        cls, template: str, field: str, values: Sequence[str], common: Mapping[str, Any]
    ) -> Lines:
        """A line per value: `template` with `{<field>}` taken by the value and its other
        `{...}` by the fields `common`, which every line also carries; the value is the line's
        `field` field too."""
        return cls(Framed.of(template, field, values, **common), common, (field, values))

    def fields(self, index: int) -> dict[str, Any]:
        fields = dict(self.common)
        if self.varying is not None:
            fields[self.varying[0]] = self.varying[1][index]
        return fields


def log_lines(logger: logging.Logger, level: int, lines: Lines) -> None:
    """Log every line of `lines` as one record, if `level` is enabled."""
    if lines.messages and logger.isEnabledFor(level):
        logger.log(level, "%s", lines, extra={"rig_lines": lines})


def messages(record: logging.LogRecord) -> list[str]:
    """The sentences a record carries: one, or a batch's."""
    lines: Lines | None = getattr(record, "rig_lines", None)
    return list(lines.messages) if lines is not None else [record.getMessage()]


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        lines: Lines | None = getattr(record, "rig_lines", None)
        if lines is None:
            return escape(super().format(record))  # a traceback too: one record, one line
        # Every line of a batch shares its record's time, level and logger: format them once.
        prefix = escape(f"{self.formatTime(record)} {record.levelname:<7} {record.name}: ")
        messages = lines.messages
        if type(messages) is Framed:
            return messages.escaped().render(prefix)
        if not _clean("".join(messages)):
            messages = [escape(message) for message in messages]
        return "\n".join(prefix + message for message in messages)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        head: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
        }
        lines: Lines | None = getattr(record, "rig_lines", None)
        if lines is not None:
            return _json_lines(head, lines)
        payload = {**head, "message": record.getMessage()}
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def _json_lines(head: Mapping[str, Any], lines: Lines) -> str:
    """A batch as JSON lines, each the object a record of its own would give: the parts every
    line shares are encoded once, and per line only its sentence and its varying field."""
    start = json.dumps(dict(head), default=str)[:-1] + ', "message": '
    common = json.dumps(dict(lines.common), default=str)[1:-1]
    rest = (", " + common if common else "") + "}"
    if lines.varying is None:
        return "\n".join(start + _quote(m) + rest for m in lines.messages)
    name, values = lines.varying
    if name in lines.common:  # the varying field replaces a shared one of the same name
        return "\n".join(
            json.dumps({**head, "message": m, **lines.fields(i)}, default=str)
            for i, m in enumerate(lines.messages)
        )
    key = ", " + json.dumps(name) + ": "
    framed = lines.messages
    if type(framed) is Framed and framed.values is values and _plain(values):
        # The sentence and the field hold the value as it is, so a line is: `start` and the
        # quoted prefix, the value, the quoted suffix and the key, the value, `rest`. Quoting
        # escapes character by character: the quoted parts put together are the quoted whole.
        first = start + _quote(framed.prefix)[:-1]
        middle = _quote(framed.suffix)[1:-1] + '"' + key + '"'
        last = '"' + rest
        return first + (last + "\n" + first).join([v + middle + v for v in values]) + last
    return "\n".join(
        start
        + _quote(m)
        + key
        + (_quote(v) if type(v) is str else json.dumps(v, default=str))
        + rest
        for m, v in zip(lines.messages, values, strict=True)
    )


def _plain(values: Sequence[Any]) -> bool:
    """Whether every value is a str that JSON holds as it is, with no character escaped."""
    try:
        joined = "".join(values)
    except TypeError:
        return False
    return len(_quote(joined)) == len(joined) + 2


class _Enqueue(logging.handlers.QueueHandler):
    """Hands records to the writer thread as they are: the formatting happens there."""

    def __init__(self, writer: _WriterThread) -> None:
        super().__init__(writer.records)
        self._writer = writer

    def enqueue(self, record: logging.LogRecord) -> None:
        self._writer.put(record)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if not hasattr(record, "rig_lines"):
            # Freeze the message now: its arguments may change after the call returns.
            record.msg, record.args = record.getMessage(), None
        return record


class _WriterThread:
    """Takes records off the queue, formats them and writes them to stderr in order, on a daemon
    thread: a stderr that blocks (a full pipe nobody reads) holds up this thread only, never a
    scan or the exit. Not a logging.Handler: logging's shutdown would wait on its lock.

    A failed write (stderr closed, or gone) is dropped without a word: the stream to report it
    on is the one that failed.
    """

    def __init__(self, formatter: logging.Formatter) -> None:
        self.records: queue.Queue[logging.LogRecord | None] = queue.Queue(QUEUE_RECORDS)
        self._formatter = formatter
        self.written = 0
        self._progress_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rig-log-writer", daemon=True)
        self._thread.start()

    def put(self, record: logging.LogRecord | None) -> bool:
        """Queue `record`, waiting while the queue is full and stderr keeps taking lines. False
        when stderr took nothing for STALL_S: the record is dropped, nothing waits on it."""
        while True:
            try:
                self.records.put(record, timeout=0.05)
                return True
            except queue.Full:
                if time.monotonic() - self._progress_at > STALL_S:
                    return False

    def _run(self) -> None:
        while (record := self.records.get()) is not None:
            with contextlib.suppress(Exception):
                stream = sys.stderr  # of the moment: tests swap it
                stream.write(self._formatter.format(record) + "\n")
                stream.flush()
            self.written += 1
            self._progress_at = time.monotonic()

    def stop(self) -> None:
        """Write what is queued, for as long as stderr takes it. A stderr that takes nothing for
        STALL_S (a full pipe nobody reads) is given up on: the process must be able to exit,
        and Python's own flush of stderr at exit would block on it too."""
        if self.put(None):
            seen, stalled = -1, 0.0
            while self._thread.is_alive() and stalled < STALL_S:
                self._thread.join(0.1)
                stalled = 0.0 if self.written != seen else stalled + 0.1
                seen = self.written
        if self._thread.is_alive():
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives until the exit


_writer_thread: _WriterThread | None = None


def config(log_format: str = "text", level: str = "INFO") -> dict[str, Any]:
    """The dictConfig for `log_format` ("text" or "json"): everything to stderr."""
    formatters: dict[str, Any] = {
        "text": {"()": TextFormatter},
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
    """`config`, with the stderr handler moved behind a queue and a writer thread."""
    global _writer_thread
    logging.config.dictConfig(config(log_format, level))
    root = logging.getLogger()
    [direct] = root.handlers
    assert direct.formatter is not None
    stop_writer()
    _writer_thread = _WriterThread(direct.formatter)
    root.handlers = [_Enqueue(_writer_thread)]


def stop_writer() -> None:
    """Write what is queued and stop the writer thread (at exit, and before a reconfigure)."""
    global _writer_thread
    thread, _writer_thread = _writer_thread, None
    if thread is not None:
        thread.stop()


atexit.register(stop_writer)
