"""What routes share: the runtime (clients, writer, reaper) and who is calling."""

from __future__ import annotations

from fastapi import HTTPException, Request

from rig_conductor import roles
from rig_conductor.runtime import Runtime, ScanNow

__all__ = ["Runtime", "ScanNow", "caller", "require", "runtime"]


async def runtime(request: Request) -> Runtime:
    value: Runtime = request.app.state.runtime
    return value


async def caller(request: Request) -> roles.Caller:
    """Who made the request, as the role guard found it (an open API: anonymous)."""
    found: roles.Caller = getattr(request.state, "caller", roles.ANONYMOUS)
    return found


def require(rt: Runtime, who: roles.Caller, need: roles.Need) -> None:
    """403 unless `who` may do `need`: for a route whose need depends on its parsed parameters
    (a scan is a change unless it is a dry run)."""
    tokens = rt.tokens if rt.tokens is not None else roles.Tokens()
    if not tokens.allows(who, need):
        raise HTTPException(403, detail=f"the {who.role.name.lower()} role may not do this")
