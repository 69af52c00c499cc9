"""A scan an operator ran from the console: its audit line and event-log row, written through
the write port (the scan itself logs and records its moves as every scan does)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rig_conductor import logs, roles
from rig_conductor.effects import port
from rig_conductor.runtime import Runtime

logger = logging.getLogger(logs.CONSOLE_LOGGER)


async def record_console_scan(rt: Runtime, caller: roles.Caller, report: Mapping[str, Any]) -> None:
    summary = {
        key: report.get(key)
        for key in ("pending", "reclaimed", "deadLettered", "noTarget", "durationMs")
    }
    effects = port.choose(False, engine=rt.engine, tenant=rt.settings.tenant)
    await effects.scan_requested(caller.who, summary)
    logger.info(
        "[Console] %s ran a scan: %d reclaimed, %d dead-lettered, %d without a target",
        caller.who,
        summary["reclaimed"] or 0,
        summary["deadLettered"] or 0,
        summary["noTarget"] or 0,
    )
