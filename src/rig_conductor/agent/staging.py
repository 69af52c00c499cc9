"""Staged file writes: a handler writes beside the final path, the runtime renames on acceptance.

The rename happens only after the conductor has accepted the attempt's WORK_COMPLETED, and the
intent (which temporary file goes where) is recorded in Redis before asking, so whichever
runtime sees the entry next can finish a commit that a crash interrupted. Committing is
idempotent; nothing here decides whether to commit: the runtime does.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, cast

from rig_conductor.adapters.redis_client import AnyRedis

logger = logging.getLogger(__name__)

# An intent nobody finished (the entry was dead-lettered, say) must not stay forever.
INTENT_TTL_S = 7 * 24 * 3600
_MAX_NAME = 200  # keep `.<name>.<entry id>.a<attempt>.tmp` under the usual 255-byte limit


class StagedFile(NamedTuple):
    tmp: Path
    final: Path


def temp_path(final: Path, *, entry_id: str, attempt: int) -> Path:
    """`.<name>.<entryId>.a<attempt>.tmp` in the final path's directory.

    Same directory, so the rename stays on one filesystem and is atomic. Hidden, and named
    after the entry and attempt, so two attempts never share a temporary file.
    """
    return final.with_name(f".{final.name[:_MAX_NAME]}.{entry_id}.a{attempt}.tmp")


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


def flush(files: Iterable[StagedFile]) -> None:
    """fsync each temporary file, so a rename never publishes data still in the page cache."""
    for item in files:
        with contextlib.suppress(FileNotFoundError), open(item.tmp, "rb") as handle:
            os.fsync(handle.fileno())


def commit(files: Sequence[StagedFile]) -> Committed:
    """Rename every temporary file onto its final path (os.replace: atomic). Idempotent.

    A temporary file that is gone while its final file exists was committed before.
    """
    renamed = already = missing = 0
    directories: set[Path] = set()
    for item in files:
        try:
            os.replace(item.tmp, item.final)
        except FileNotFoundError:
            if item.final.exists():
                already += 1
            else:
                missing += 1
                logger.warning("Staged file %s is gone and %s does not exist", item.tmp, item.final)
            continue
        renamed += 1
        directories.add(item.final.parent)
    for directory in directories:
        _fsync_directory(directory)
    return Committed(renamed, already, missing)


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

    An attempt killed while its handler ran recorded no intent, so nothing names its temporary
    files; once the entry is done they can never be committed. They sit beside the final paths
    the accepted attempt staged (handlers usually write the same paths every attempt).
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


def encode(files: Sequence[StagedFile]) -> str:
    return json.dumps([[str(item.tmp), str(item.final)] for item in files])


def decode(text: str, *, entry_id: str, attempt: int) -> tuple[StagedFile, ...]:
    """An intent as `encode` wrote it for this entry and attempt; ValueError for anything else.

    Whoever may write `rig:staged:*` must not steer a rename or an unlink: every pair must be
    exactly what `Staging.stage` records, an absolute, normalised final path and the
    temporary name `temp_path` gives it for this entry and attempt, so the only files a
    commit or a discard touches are this attempt's own temporaries and the paths they were
    staged for.
    """
    pairs = json.loads(text)
    if not isinstance(pairs, list):
        raise ValueError("not a list of [temporary, final] pairs")
    return tuple(_checked(pair, entry_id=entry_id, attempt=attempt) for pair in pairs)


def _checked(pair: object, *, entry_id: str, attempt: int) -> StagedFile:
    if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
        raise ValueError(f"not a [temporary, final] pair: {pair!r}")
    tmp, final = pair
    if "\x00" in tmp + final or not os.path.isabs(final) or os.path.normpath(final) != final:
        raise ValueError(f"final path {final!r} is not absolute and normalised")
    final_path = Path(final)
    if not final_path.name:
        raise ValueError(f"final path {final!r} names no file")
    expected = temp_path(final_path, entry_id=entry_id, attempt=attempt)
    if tmp != str(expected):
        raise ValueError(f"temporary path {tmp!r} is not {str(expected)!r}")
    return StagedFile(expected, final_path)


def intent_key(stream: str, entry_id: str) -> str:
    return f"rig:staged:{stream}:{entry_id}"


async def record_intent(
    client: AnyRedis, *, stream: str, entry_id: str, attempt: int, files: Sequence[StagedFile]
) -> None:
    """Record, before WORK_COMPLETED is sent, which files this attempt commits on acceptance."""
    key = intent_key(stream, entry_id)
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(key, str(attempt), encode(files))
        pipe.expire(key, INTENT_TTL_S)
        await pipe.execute()


async def load_intents(
    client: AnyRedis, *, stream: str, entry_id: str
) -> dict[int, tuple[StagedFile, ...]]:
    """Every attempt's recorded intent for the entry, by attempt number."""
    # decode_responses=True (redis_client.connect): fields and values are str.
    raw = cast("Mapping[str, str]", await client.hgetall(intent_key(stream, entry_id)))
    intents: dict[int, tuple[StagedFile, ...]] = {}
    for attempt, text in raw.items():
        try:
            number = int(attempt)
            intents[number] = decode(text, entry_id=entry_id, attempt=number)
        except (ValueError, TypeError) as exc:
            # Nothing of it is renamed or unlinked: a path this runtime did not stage is not its.
            logger.warning("Refused staged intent %s of %s/%s: %s", attempt, stream, entry_id, exc)
    return intents


async def forget_attempt(client: AnyRedis, *, stream: str, entry_id: str, attempt: int) -> None:
    await client.hdel(intent_key(stream, entry_id), str(attempt))


async def forget(client: AnyRedis, *, stream: str, entry_id: str) -> None:
    await client.delete(intent_key(stream, entry_id))
