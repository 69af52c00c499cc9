"""What routes share: the runtime (clients, writer, reaper) and who is calling."""

from __future__ import annotations

from fastapi import Request

from rig_conductor import roles
from rig_conductor.runtime import Runtime, ScanNow

__all__ = ["Runtime", "ScanNow", "caller", "runtime"]


async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


async def caller(request: Request) -> roles.Caller:
    """Who made the request, as the role guard found it (an open API: anonymous)."""
    found: roles.Caller = getattr(request.state, "caller", roles.ANONYMOUS)
    return found
