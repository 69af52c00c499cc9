"""`python -m rig_conductor` runs the CLI."""

from rig_conductor.cli import main

raise SystemExit(main())
