"""What this build is: the version (one place: `rig_conductor.__version__`) and the commit it was
built from, for `rig-conductor --version` and the `rig_build_info` gauge.

The revision is read once per process and must stay cheap at start-up: the image's build sets
`RIG_BUILD_REVISION`; a source checkout (an editable install) asks git; anything else is
"unknown". An installed wheel never spawns a process for it.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from rig_conductor import __version__

__all__ = ["REVISION_ENV", "UNKNOWN", "__version__", "revision"]

REVISION_ENV = "RIG_BUILD_REVISION"
UNKNOWN = "unknown"
# src/rig_conductor/build.py -> the repository root, when this runs from a checkout.
_CHECKOUT = Path(__file__).resolve().parents[2]


@functools.cache
def revision() -> str:
    """The git commit this build was made from, or "unknown"."""
    given = os.environ.get(REVISION_ENV, "").strip()
    if given:
        return given
    if not (_CHECKOUT / ".git").exists():
        return UNKNOWN
    try:
        done = subprocess.run(
            ["git", "-C", str(_CHECKOUT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else UNKNOWN
