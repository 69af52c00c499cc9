"""Staged file writes: a handler writes beside the final path, the runtime renames on acceptance.

The rename happens only after the conductor has accepted the attempt's WORK_COMPLETED, which
carries the staged files: the conductor records them in the transaction that accepts the
completion, so whoever holds the entry next (or is handed it again after Redis lost its data)
is told what to publish and finishes a publish that a crash interrupted. Publishing is
idempotent; nothing here decides whether to publish: the runtime does.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from rig_conductor import domain

logger = logging.getLogger(__name__)

_MAX_NAME = domain.STAGED_NAME_MAX


class StagedFile(NamedTuple):
    tmp: Path
    final: Path


def temp_path(final: Path, *, entry_id: str, attempt: int) -> Path:
    """`.<name>.<entryId>.a<attempt>.tmp` in the final path's directory (`domain.staged_path`).

    Same directory, so the rename stays on one filesystem and is atomic. Hidden, and named
    after the entry and attempt, so two attempts never share a temporary file.
    """
    return Path(domain.staged_path(str(final), entry_id=entry_id, attempt=attempt))


class Staging:
    """The files one attempt of one entry staged. Thread-safe: sync handlers run in a thread."""

    def __init__(self, *, entry_id: str, attempt: int) -> None:
        self.entry_id = entry_id
        self.attempt = attempt
        self._files: dict[Path, Path] = {}
        self._lock = threading.Lock()
        self._closed = False

    def stage(self, path: str | os.PathLike[str]) -> Path:
        final = Path(os.path.abspath(path))
        if not final.name or final == final.parent:
            raise ValueError(f"cannot stage {path!s}: not a file path")
        with self._lock:
            if self._closed:
                raise RuntimeError("stage() called after the handler returned")
            tmp = self._files.get(final)
            if tmp is None:
                tmp = temp_path(final, entry_id=self.entry_id, attempt=self.attempt)
                self._files[final] = tmp
        final.parent.mkdir(parents=True, exist_ok=True)
        return tmp

    def close(self) -> tuple[StagedFile, ...]:
        """No more staging; the files staged, in order."""
        with self._lock:
            self._closed = True
            return tuple(StagedFile(tmp, final) for final, tmp in self._files.items())


@dataclass(frozen=True, slots=True)
class Committed:
    renamed: int = 0
    already: int = 0  # an earlier commit (maybe by another runtime) renamed it
    missing: int = 0  # neither the temporary nor the final file exists: nothing to commit
    # The final paths of the missing ones (WORK_PUBLISHED reports them).
    lost: tuple[str, ...] = field(default=(), compare=False)


def flush(files: Iterable[StagedFile]) -> None:
    """fsync each temporary file, so a rename never publishes data still in the page cache."""
    for item in files:
        with contextlib.suppress(FileNotFoundError), open(item.tmp, "rb") as handle:
            os.fsync(handle.fileno())


def commit(files: Sequence[StagedFile]) -> Committed:
    """Rename every temporary file onto its final path (os.replace: atomic). Idempotent.

    A temporary file that is gone while its final file exists was committed before.
    """
    renamed = already = 0
    lost: list[str] = []
    directories: set[Path] = set()
    for item in files:
        try:
            os.replace(item.tmp, item.final)
        except FileNotFoundError:
            if item.final.exists():
                already += 1
            else:
                lost.append(str(item.final))
                logger.warning("Staged file %s is gone and %s does not exist", item.tmp, item.final)
            continue
        renamed += 1
        directories.add(item.final.parent)
    for directory in directories:
        _fsync_directory(directory)
    return Committed(renamed, already, len(lost), tuple(lost))


def discard(files: Iterable[StagedFile]) -> int:
    """Remove the temporary files of an attempt that will never be committed."""
    removed = 0
    for item in files:
        with contextlib.suppress(FileNotFoundError):
            item.tmp.unlink()
            removed += 1
    return removed


def remove_leftovers(files: Iterable[StagedFile], *, entry_id: str, keep_attempt: int) -> int:
    """Remove other attempts' temporary files for the same final paths of the same entry.

    An attempt killed while its handler ran never reported its outputs, so nothing names its
    temporary files; once the entry is done they can never be published. They sit beside the
    final paths the accepted attempt staged (handlers usually write the same paths every
    attempt).
    """
    removed = 0
    for item in files:
        prefix = f".{item.final.name[:_MAX_NAME]}.{entry_id}.a"
        for path in item.final.parent.glob(glob.escape(prefix) + "*.tmp"):
            attempt = path.name[len(prefix) : -len(".tmp")]
            if attempt.isdigit() and int(attempt) != keep_attempt:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += 1
    return removed


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # not every filesystem fsyncs directories
            os.fsync(fd)
    finally:
        os.close(fd)


def outputs(files: Iterable[StagedFile]) -> tuple[domain.StagedOutput, ...]:
    """The staged files as WORK_COMPLETED reports them."""
    return tuple(domain.StagedOutput(str(item.tmp), str(item.final)) for item in files)


def from_outputs(
    recorded: Iterable[domain.StagedOutput], *, attempt: int
) -> tuple[StagedFile, ...]:
    """The outputs the conductor recorded for `attempt`, as files to publish; ValueError when one
    is not a staging temporary of its path for that attempt (`domain.staged_output`): nothing is
    renamed then."""
    return tuple(
        StagedFile(Path(item.staged), Path(item.path))
        for item in (domain.staged_output(o.staged, o.path, attempt=attempt) for o in recorded)
    )
