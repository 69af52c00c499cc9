"""A projected ServiceAccount token volume as the kubelet writes it, for the agent's token tests."""

from __future__ import annotations

import os
from pathlib import Path


def projected(volume: Path, token: str, version: int) -> Path:
    """What the kubelet's atomic writer does on every rotation: the token in a new timestamped
    directory, then `..data` swapped to it (a rename over the old symlink, atomic). Returns the
    path a pod reads, `<volume>/token`, a symlink to `..data/token` that never changes."""
    data = volume / f"..2026_01_01_00_00_{version:02d}.000000000"
    data.mkdir(parents=True)
    (data / "token").write_text(token)
    staged = volume / "..data_tmp"
    staged.symlink_to(data.name)
    os.replace(staged, volume / "..data")
    path = volume / "token"
    if not path.is_symlink():
        path.symlink_to("..data/token")
    return path
