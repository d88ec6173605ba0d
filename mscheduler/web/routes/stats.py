"""``/api/v1/stats`` and ``/api/v1/whoami`` (the presented token's role)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from mscheduler.domain.fairness import KEY_WAITS_MAX
from mscheduler.web.deps import COMMON_DEPENDENCIES, ERROR_ANSWERS, Ops
from mscheduler.web.guards import AnswerCache
from mscheduler.web.models import KeyWaitsOut, StatsOut, WhoAmIOut

misc = APIRouter(tags=["stats"], dependencies=COMMON_DEPENDENCIES, responses=ERROR_ANSWERS)


@misc.get("/stats", response_model=StatsOut, summary="Task statistics (counts, rates, durations)")
async def stats(
    operations: Ops,
    request: Request,
    window: Annotated[
        float | None, Query(ge=60, le=7 * 86400, description="seconds of the rates' window (default 1 h)")
    ] = None,
    names: Annotated[
        str | None, Query(max_length=10_000, description="only these task names (comma-separated)")
    ] = None,
    statuses: Annotated[
        str | None, Query(max_length=1000, description="only these statuses (comma-separated)")
    ] = None,
) -> Response:
    """Counts by status, plus ``Operations.stats()`` (success rates, duration
    percentiles, throughput over the window) in ``details``. Computed at most once per
    ``ApiLimits.stats_cache_seconds`` (1 s by default) however many clients ask the same: an
    answer may be that much old."""
    filters: dict[str, Any] = {"names": _listed(names), "statuses": _listed(statuses)}
    if window is not None:
        filters["window"] = window

    async def compute() -> bytes:
        details = await operations.stats(**filters)
        answer = StatsOut(counts=details.counts, total=details.total, details=details)
        return answer.model_dump_json().encode()

    cache: AnswerCache = request.app.state.stats_cache
    body = await cache.get(repr(sorted(filters.items())), compute)
    return Response(body, media_type="application/json")


@misc.get("/stats/keys", response_model=KeyWaitsOut, summary="Due tasks and waits per fairness key")
async def key_waits(
    operations: Ops,
    request: Request,
    names: Annotated[
        str | None, Query(max_length=10_000, description="only these task names (comma-separated)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=KEY_WAITS_MAX, description="at most this many keys")] = 100,
) -> Response:
    """``Operations.key_waits()``: per fairness key, its due tasks and how long the one due
    first has waited, the longest wait first. Cached like ``/stats``."""
    listed = _listed(names)

    async def compute() -> bytes:
        waits = await operations.key_waits(names=listed, limit=limit)
        return KeyWaitsOut(keys=waits).model_dump_json().encode()

    cache: AnswerCache = request.app.state.stats_cache
    body = await cache.get(repr(("keys", listed, limit)), compute)
    return Response(body, media_type="application/json")


def _listed(value: str | None) -> list[str] | None:
    return None if value is None else [part.strip() for part in value.split(",")]


@misc.get("/whoami", response_model=WhoAmIOut, summary="The role of the presented token")
async def whoami(request: Request) -> WhoAmIOut:
    """What this token may do: the dashboard shows its action buttons to admin tokens only."""
    return WhoAmIOut(role=request.state.role, name=request.state.identity.name)
