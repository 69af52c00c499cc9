"""`rig-conductor serve` on another server stack than its own, for bench/ingest.py's lines of the
stacks side by side: the same command and settings, with the protocol and the loop of
`rig_conductor.serving.config` replaced as bench/noop_app.py replaces them.

    .venv/bin/python bench/serve_on.py h11+asyncio
"""

from __future__ import annotations

import functools
import sys

from noop_app import STACKS
from rig_conductor import cli, serving

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in STACKS:
        sys.exit(f"usage: serve_on.py {{{','.join(sorted(STACKS))}}}")
    serving.config = functools.partial(serving.config, **STACKS[sys.argv[1]])
    sys.exit(cli.main(["serve"]))
