"""``/api/v1/stats`` (SPEC F27) and ``/api/v1/whoami`` (the presented token's role)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from mscheduler.web.deps import _ERRORS, Ops, _common
from mscheduler.web.models import StatsOut, WhoAmIOut

misc = APIRouter(tags=["stats"], dependencies=_common, responses=_ERRORS)


@misc.get("/stats", response_model=StatsOut, summary="Task statistics (counts, rates, durations)")
async def stats(
    operations: Ops,
    window: Annotated[
        float | None, Query(ge=60, le=7 * 86400, description="seconds of the rates' window (default 1 h)")
    ] = None,
) -> StatsOut:
    """Counts by status, plus ``Operations.stats()`` (SPEC F27: success rates, duration
    percentiles, throughput over the window) in ``details``."""
    details = await operations.stats(window=window) if window is not None else await operations.stats()
    return StatsOut(counts=details.counts, total=details.total, details=details)


@misc.get("/whoami", response_model=WhoAmIOut, summary="The role of the presented token")
async def whoami(request: Request) -> WhoAmIOut:
    """What this token may do: the dashboard shows its action buttons to admin tokens only."""
    return WhoAmIOut(role=request.state.role, name=request.state.identity.name)
