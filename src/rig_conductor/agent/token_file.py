"""The agent's bearer token read from a file that may be replaced at any time (RIG_API_TOKEN_FILE).

The kubelet rotates a projected ServiceAccount token by writing a new timestamped directory and
swapping the volume's `..data` symlink to it, so the token's path keeps its name while the file
behind it changes. `TokenFile.current()` stats the path (following symlinks) before every
request and reads it again when its inode, size or mtime moved; after a 401, `refresh()` reads
it again whatever the stat says, at most every few seconds. Only reads: what a refused request
means is the conductor client's business.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

REREAD_INTERVAL_S = 5.0

_Stamp = tuple[int, int, int, int]


class TokenFileError(Exception):
    """The token file cannot be read or holds no token; the message names the path."""


def read_token(path: Path) -> str:
    """The token in `path`, surrounding whitespace stripped. Raises TokenFileError."""
    try:
        token = path.read_bytes().decode("utf-8").strip()
    except OSError as exc:
        raise TokenFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TokenFileError(f"{path} does not hold a text token") from None
    if not token:
        raise TokenFileError(f"{path} is empty")
    return token


class TokenFile:
    """The current token of one file. Reads the file at once: raises TokenFileError."""

    def __init__(
        self,
        path: Path,
        *,
        reread_interval_s: float = REREAD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._interval = reread_interval_s
        self._clock = clock
        self._stamp = _stamp(path)
        self._token = read_token(path)
        self._read_at = clock()

    def current(self) -> str:
        """The token, read again first when the file behind the path has changed."""
        stamp = _stamp(self.path)
        if stamp is not None and stamp != self._stamp:
            self._reload(stamp)
        return self._token

    def refresh(self) -> bool:
        """Read the file again after the token was refused; True when it now holds another.

        At most once every `reread_interval_s`, so a token the conductor will never take does
        not turn every request into two reads and two tries.
        """
        if self._clock() - self._read_at < self._interval:
            return False
        before = self._token
        self._reload(_stamp(self.path))
        return self._token != before

    def _reload(self, stamp: _Stamp | None) -> None:
        self._read_at = self._clock()
        try:
            token = read_token(self.path)
        except TokenFileError as exc:
            # Mid-rotation or a broken mount: the previous token may still be valid for a while.
            logger.warning("Keeping the previous API token: %s", exc)
            return
        if token != self._token:
            logger.info("API token read again from %s (the file changed)", self.path)
        self._token, self._stamp = token, stamp


def _stamp(path: Path) -> _Stamp | None:
    try:
        st = os.stat(path)  # follows the symlinks the kubelet swaps
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
