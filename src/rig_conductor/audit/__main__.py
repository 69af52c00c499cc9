"""`python -m rig_conductor.audit`: the audit with settings from the RIG_* environment."""

import sys

from rig_conductor.audit.main import run_from_environment

sys.exit(run_from_environment())
